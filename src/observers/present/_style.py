"""Labels, units and scales shared by the plots, the comparison and the report."""

from __future__ import annotations

import base64
import io
import re
from typing import TYPE_CHECKING, Iterable

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# name -> (readable label, unit)
_KNOWN = {
    "loss": ("loss", ""),
    "learning_rate": ("learning rate", ""),
    "grad_norm": ("gradient L2 norm", ""),
    "param_norm": ("parameter L2 norm", ""),
    "update_ratio": ("update / parameter norm", ""),
    "step_time": ("step time", "s"),
    "data_time": ("data wait", "s"),
    "forward_time": ("forward", "s"),
    "backward_time": ("backward", "s"),
    "optimizer_time": ("optimizer", "s"),
    "samples": ("samples per step", "samples"),
    "throughput": ("throughput", "samples/s"),
    "micro_batches": ("micro-batches per step", ""),
}

# Short names accepted for system metrics (the system table may use OTel hardware names).
SYSTEM_ALIASES = {
    "gpu_util": ("gpu_util", "gpu.utilization", "hw.gpu.utilization", "gpu_utilization"),
    "gpu_memory": ("gpu_memory", "hw.gpu.memory.usage", "gpu.memory.used", "gpu_memory_used"),
    "gpu_power": ("gpu_power", "hw.power", "gpu.power"),
    "gpu_temp": ("gpu_temp", "hw.temperature", "gpu.temperature"),
    "cpu_util": ("cpu_util", "cpu_percent", "system.cpu.utilization", "process.cpu.utilization"),
    "memory": ("memory", "system.memory.usage", "process.memory.usage", "rss"),
}

HIGHER_IS_BETTER = re.compile(r"(acc|accuracy|f1|auc|precision|recall|score|throughput|reward|bleu|rouge)",
                              re.I)


def metric_label(name: str, *, with_unit: bool = True) -> str:
    """``'step_time'`` -> ``'step time (s)'``; unknown names are shown as they are."""
    label, unit = _KNOWN.get(name, (None, ""))
    if label is None:
        m = re.match(r"^learning_rate/pg(\d+)$", name)
        if m:
            label = f"learning rate (group {m.group(1)})"
        else:
            label, unit = name, metric_unit(name)
    return f"{label} ({unit})" if with_unit and unit else label


def metric_unit(name: str) -> str:
    if name in _KNOWN:
        return _KNOWN[name][1]
    low = name.lower()
    if low.endswith(("_time", ".duration", "_seconds", "_s")):
        return "s"
    if "util" in low or "percent" in low:
        return "%"
    if "temp" in low:
        return "°C"
    if "power" in low:
        return "W"
    if "memory" in low or low.endswith("_bytes") or "rss" in low:
        return "bytes"
    return ""


def axis_label(names: Iterable[str]) -> str:
    """One y-axis label for several metrics; a shared unit is shown once."""
    names = list(names)
    units = {metric_unit(n) for n in names}
    labels = [metric_label(n, with_unit=False) for n in names]
    text = ", ".join(labels)
    if len(units) == 1 and (unit := units.pop()):
        text += f" ({unit})"
    return text


def wants_log(values: Iterable[np.ndarray] | np.ndarray, *, span: float = 30.0) -> bool:
    """Log scale when every value is positive and they span more than ``span`` x."""
    arrays = [np.asarray(v, dtype=float) for v in (values if isinstance(values, (list, tuple)) else [values])]
    arr = np.concatenate([a[np.isfinite(a)] for a in arrays]) if arrays else np.array([])
    if arr.size < 2 or (arr <= 0).any():
        return False
    return float(arr.max() / arr.min()) > span


def set_log_scale(ax, axis: str = "y") -> None:
    """Log scale with plain-number tick labels (0.2, 3, 100) rather than 2x10^-1."""
    from matplotlib.ticker import LogFormatter

    class _Plain(LogFormatter):
        def __call__(self, x: float, pos: int | None = None) -> str:
            return f"{x:g}" if super().__call__(x, pos) else ""

    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(_Plain(labelOnlyBase=False))
    target.set_minor_formatter(_Plain(labelOnlyBase=False, minor_thresholds=(1.5, 0.6)))


def higher_is_better(metric: str) -> bool:
    return bool(HIGHER_IS_BETTER.search(metric))


def fmt_number(value: object, digits: int = 4) -> str:
    """Compact number formatting for tables and messages."""
    if value is None or value is pd.NA or value is pd.NaT:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if np.isnan(v):
            return ""
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.{max(digits - 1, 1)}e}"
        return f"{v:.{digits}g}"
    return str(value)


def fmt_factor(ratio: float) -> str:
    """``100.0`` -> ``'100x'``, ``3.16`` -> ``'3.2x'``."""
    if ratio >= 10:
        return f"{ratio:,.0f}x"
    return f"{ratio:.2g}x"


def figure_png(fig: "Figure", dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def figure_data_uri(fig: "Figure", dpi: int = 110) -> str:
    return "data:image/png;base64," + base64.b64encode(figure_png(fig, dpi)).decode("ascii")
