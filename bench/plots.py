"""The figures: the attention sweep (time, memory, TFLOP/s vs seqlen) and a training sweep
(tokens/s and peak memory vs seq_len, loss vs tokens)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.impls import IMPL_NAMES
from bench.runs import attention_order, loss_curve


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed; files only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ----------------------------------------------------------------------------------------------
# Attention sweep: one panel per (dtype, head_dim) × causal, one line per implementation
# ----------------------------------------------------------------------------------------------

ATTENTION_PLOTS = {
    # file name: (y value of a row, y label, log y)
    "attention_time.png": (lambda r: r["fwdbwd_ms"], "forward+backward time (ms)", True),
    "attention_memory.png": (lambda r: None if r["peak_mem_mib"] is None else r["peak_mem_mib"] / r["batch"],
                             "extra peak memory per sequence (MiB)", True),
    "attention_tflops.png": (lambda r: r["fwdbwd_tflops"], "forward+backward TFLOP/s", False),
}


def plot_attention_sweep(rows: list[dict[str, Any]], plot_dir: Path) -> list[Path]:
    """Time, memory and TFLOP/s vs seqlen; a dotted vertical line marks where an implementation
    first ran out of memory. Memory is per sequence, so at fixed tokens the N×N implementations
    rise as N² and the tiled ones as N (dashed reference slopes)."""
    plt = pyplot()
    plot_dir.mkdir(parents=True, exist_ok=True)
    panels = sorted({(r["dtype"], r["head_dim"]) for r in rows})
    causals = sorted({r["causal"] for r in rows})
    present = {r["impl"] for r in rows}
    impls = [n for n in IMPL_NAMES if n in present] + sorted(present - set(IMPL_NAMES))
    extra = [n for n in impls if n not in IMPL_NAMES]
    # one color per impl in every plot: the default cycle's ten, then colors unlike any of them
    # (cycling the ten gave flex flash's color)
    palette = [f"C{i}" for i in range(10)] + ["black", "goldenrod", "darkslategray", "lime", "navy", "maroon"]
    colors = {name: palette[i % len(palette)] for i, name in enumerate([*IMPL_NAMES, *extra])}
    written = []
    for filename, (value, ylabel, logy) in ATTENTION_PLOTS.items():
        height = 3.8 * len(panels) + 0.7  # + room for the shared legend on top
        fig, axes = plt.subplots(len(panels), len(causals), figsize=(5.5 * len(causals), height), squeeze=False)
        for (dtype, d), ax_row in zip(panels, axes):
            for causal, ax in zip(causals, ax_row):
                panel = [r for r in rows if (r["dtype"], r["head_dim"], r["causal"]) == (dtype, d, causal)]
                _plot_panel(ax, panel, impls, colors, value, logy, reference_slopes=filename == "attention_memory.png")
                ax.set_title(f"{dtype}, head_dim {d}, {'causal' if causal else 'non-causal'}", fontsize=9)
                ax.set_xlabel("seqlen")
                ax.set_ylabel(ylabel, fontsize=8)
        handles = {}
        for ax in axes.flat:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, handle)
        if handles:
            fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=min(6, len(handles)), fontsize=8)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.7 / height))
        path = plot_dir / filename
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _plot_panel(ax, panel, impls, colors, value, logy: bool, reference_slopes: bool) -> None:
    from matplotlib.ticker import NullLocator

    for name in impls:
        pts = sorted((r["seqlen"], value(r)) for r in panel if r["impl"] == name and r["status"] == "ok" and value(r) is not None)
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, color=colors[name], label=name)
        ooms = sorted(r["seqlen"] for r in panel if r["impl"] == name and r["status"] == "oom")
        if ooms:
            ax.axvline(ooms[0], color=colors[name], ls=":", lw=1.2, label=f"{name} OOM from here")
    ax.set_xscale("log", base=2)
    seqlens = sorted({r["seqlen"] for r in panel})
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(seqlens, [str(n) for n in seqlens], fontsize=7)
    if logy:
        ax.set_yscale("log")
    ys = [value(r) for r in panel if r["status"] == "ok" and value(r)]
    if reference_slopes and ys:
        n0, y0 = seqlens[0], min(ys)
        for power, label in ((1, "∝ N"), (2, "∝ N²")):
            ax.plot(seqlens, [y0 * (n / n0) ** power for n in seqlens], ls="--", lw=0.8, color="0.6" if power == 1 else "0.3", label=label)
    ax.grid(True, which="both", alpha=0.3)


# ----------------------------------------------------------------------------------------------
# Training sweep
# ----------------------------------------------------------------------------------------------


def plot_train_sweep(rows: list[dict[str, Any]], path: Path) -> Path:
    """tokens/s and peak memory vs seq_len, one line per attention (an x on the axis marks OOM), and
    the loss curves (train loss vs tokens, one line per run; dots: val loss). The memory panel is left
    out when no run measured memory (CPU)."""
    plt = pyplot()
    models = sorted({r["model"] for r in rows})
    lines = [(m, a) for m in models for a in attention_order(rows)]
    colors = {line: f"C{i % 10}" for i, line in enumerate(lines)}  # one color per attention in every panel
    label = {line: line[1] if len(models) == 1 else f"{line[1]} ({line[0]})" for line in lines}
    panels = [("tokens_per_s", "tokens / s")]
    if any(r["peak_mem_gib"] is not None or r["status"] == "oom" for r in rows):
        panels.append(("peak_mem_gib", "peak memory (GiB)"))
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(5.5 * (len(panels) + 1), 4))
    for line in lines:
        mine = sorted((r for r in rows if (r["model"], r["attention"]) == line), key=lambda r: r["seq_len"])
        for ax, (key, _) in zip(axes, panels):
            ok = [(r["seq_len"], r[key]) for r in mine if r["status"] == "ok" and r[key] is not None]
            if ok:
                ax.plot(*zip(*ok), marker="o", color=colors[line], label=label[line])
            ooms = [r["seq_len"] for r in mine if r["status"] == "oom"]
            if ooms:
                ax.plot(ooms, [0] * len(ooms), "x", ms=10, mew=2, color=colors[line], label=f"{label[line]}: out of memory",
                        clip_on=False)
    seqlens = sorted({r["seq_len"] for r in rows})
    for ax, (_, ylabel) in zip(axes, panels):
        ax.set_xscale("log", base=2)
        ax.set_xticks(seqlens, [str(n) for n in seqlens])
        ax.set_xlabel("seq_len")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    _plot_losses(axes[-1], rows, colors, label, seqlens)
    fig.suptitle(f"training sweep: {', '.join(models)}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_losses(ax, rows: list[dict[str, Any]], colors: dict, label: dict, seqlens: list[int]) -> None:
    """Train loss vs tokens, one line per run: the attention's color, a line style per seq_len."""
    styles = {n: ("-", "--", ":", "-.")[i % 4] for i, n in enumerate(seqlens)}
    for r in rows:
        curves = loss_curve(Path(r["run_dir"]))
        line = (r["model"], r["attention"])
        color = colors[line]
        if curves["train"]:
            ax.plot(*zip(*curves["train"]), ls=styles[r["seq_len"]], lw=1, color=color, label=f"{label[line]} n{r['seq_len']}")
        if curves["val"]:
            ax.plot(*zip(*curves["val"]), "o", ms=3, color=color)
    ax.set_xlabel("tokens")
    ax.set_ylabel("train loss (dots: val)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


# ----------------------------------------------------------------------------------------------
# Long-context frontier
# ----------------------------------------------------------------------------------------------


def plot_long_context(rows: list[dict[str, Any]], path: Path, gpu_memory_gib: float | None = None) -> Path:
    """Peak memory and tokens/s vs seq_len (log-log), one line per attention × checkpointing (solid
    with circles: none, dashed with squares: blocks, so a line of one point still shows which); an
    x on the bottom edge marks the first seq_len that ran out of memory, a dotted line the GPU's
    memory."""
    from matplotlib.transforms import blended_transform_factory

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    attns = attention_order(rows)
    lines = sorted({(r["attention"], r["checkpointing"], r["position"]) for r in rows},
                   key=lambda line: (attns.index(line[0]), line[1:]))
    positions = {line[2] for line in lines}
    for attn, ckpt, pos in lines:
        mine = sorted((r for r in rows if (r["attention"], r["checkpointing"], r["position"]) == (attn, ckpt, pos)),
                      key=lambda r: r["seq_len"])
        color, style, marker = f"C{attns.index(attn) % 10}", *(("-", "o") if ckpt == "none" else ("--", "s"))
        label = f"{attn}, checkpointing {ckpt}" + (f", {pos}" if len(positions) > 1 else "")
        ooms = [r["seq_len"] for r in mine if r["status"] == "oom"]
        for ax, value in zip(axes, ("peak_mem_gib", "tokens_per_s")):
            ok = [(r["seq_len"], r[value]) for r in mine if r["status"] == "ok" and r[value]]
            if ok:
                ax.plot(*zip(*ok), marker=marker, ms=5, ls=style, color=color, label=label)
            if ooms:  # log axes have no 0: the marker sits on the bottom edge, in axes coordinates
                edge = blended_transform_factory(ax.transData, ax.transAxes)
                ax.plot([min(ooms)], [0.02], "x", ms=9, mew=2, color=color, transform=edge, clip_on=False,
                        label=f"{label}: out of memory from here")
    if gpu_memory_gib:
        axes[0].axhline(gpu_memory_gib, color="0.4", ls=":", lw=1, label=f"GPU memory ({gpu_memory_gib:.0f} GiB)")
    seq_lens = sorted({r["seq_len"] for r in rows})
    for ax, ylabel in zip(axes, ("peak memory (GiB)", "tokens / s")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(seq_lens, [f"{n // 1024}K" if n >= 1024 else str(n) for n in seq_lens])
        ax.set_xlabel("seq_len (batch 1)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    handles: dict[str, Any] = {}  # both panels' lines (on the CPU the memory panel has none)
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        axes[0].legend(handles.values(), handles.keys(), fontsize=7)
    fig.suptitle("long context on one GPU: memory and speed per attention × activation checkpointing", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
