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

# Short names accepted for system metrics when observers.metric_names is not available.
SYSTEM_ALIASES = {
    "gpu_util": ("gpu_util", "hw.gpu.utilization"),
    "gpu_mem": ("gpu_mem", "gpu_memory", "hw.gpu.memory.usage"),
    "gpu_power": ("gpu_power", "hw.power"),
    "gpu_temp": ("gpu_temp", "hw.temperature"),
    "cpu_util": ("cpu_util", "system.cpu.utilization"),
    "proc_rss": ("proc_rss", "process.memory.usage", "rss"),
}

# Panels plot_system shows first, when present.
SYSTEM_PREFERRED = ("gpu_util", "gpu_mem", "gpu_power", "gpu_temp", "torch_mem_allocated",
                    "torch_mem_reserved", "gpu_proc_mem", "cpu_util", "proc_cpu_util", "mem_used",
                    "proc_rss", "child_cpu_util", "disk_read", "net_recv")


def _system_metric(name: str):
    """The :class:`observers.metric_names.SystemMetric` of a short or OTel name, if known."""
    try:
        from observers import metric_names
    except ImportError:  # pragma: no cover - table not installed
        return None
    short = metric_names.canonical(name) if hasattr(metric_names, "canonical") else None
    return metric_names.SYSTEM_METRICS.get(short or name)


def system_aliases(name: str) -> tuple[str, ...]:
    """Every spelling of a system metric (short name first)."""
    info = _system_metric(name)
    if info is not None:
        return (info.name, name)
    for names in SYSTEM_ALIASES.values():
        if name in names:
            return names
    return (name,)


def display_values(name: str, values: np.ndarray) -> tuple[np.ndarray, str]:
    """Values of a system metric in a readable unit: fractions as %, bytes as GiB/MiB, Hz as MHz."""
    values = np.asarray(values, dtype=float)
    info = _system_metric(name)
    unit = (info.table_unit or info.unit) if info is not None else metric_unit(name)
    peak = float(np.nanmax(np.abs(values))) if values.size and np.isfinite(values).any() else 0.0
    if unit == "1" and ("util" in name or name.endswith(("_ratio", "_fan"))):
        return values * 100.0, "%"
    if unit in ("By", "bytes"):
        return (values / 2**30, "GiB") if peak >= 2**30 else (values / 2**20, "MiB")
    if unit == "By/s":
        return values / 2**20, "MiB/s"
    if unit == "Hz":
        return values / 1e6, "MHz"
    if unit == "Cel":
        return values, "°C"
    if unit.startswith("{") and unit.endswith("}"):
        return values, unit[1:-1].replace("_", " ") + "s"
    return values, "" if unit == "1" else unit


def system_title(name: str) -> str:
    info = _system_metric(name)
    if info is not None and info.description:
        return f"{info.description} [{info.name}]"
    return name


_HIGHER = re.compile(r"(acc|accuracy|f1|auc|precision|recall|score|reward|bleu|rouge|map\b)", re.I)
_LOWER = re.compile(r"(loss|err|error|perplexity|ppl|nll|mse|mae|rmse|wer|cer)", re.I)


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


def objective(metric: str) -> str | None:
    """``"min"`` for loss-like names, ``"max"`` for accuracy-like ones, else ``None``."""
    if _LOWER.search(metric):
        return "min"
    if _HIGHER.search(metric):
        return "max"
    return None


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
        if abs(v) >= 1e15:
            return f"{v:.{max(digits - 1, 1)}e}"
        if abs(v) >= 10 ** digits:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"     # 0.0001 stays 0.0001; 1e-05 and below in exponent form
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
