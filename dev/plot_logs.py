#!/usr/bin/env python3
"""plot_logs.py: the loss protocol's report from trainer main.log files.

    python3 dev/plot_logs.py RUN_DIR_OR_MAIN_LOG [...] [--labels a,b] [--out curves.png] [--table out.md] [--telemetry quant.png]

For each run prints (and with --table writes as markdown) what doc/protocol.md asks for: the lowest
validation loss and its step, the train loss averaged over steps 301-350, the train loss averaged
over the last 50 steps, and the validation loss at the last step; with two or more runs, each
figure's ratio to the first run (the baseline, e.g. BF16). Draws every run's train and validation
curves on one PNG (--out). main.log lines: "s:STEP trl:LOSS ..." (train) and "s:STEP tel:LOSS" (val);
lines starting with '#' are metadata ("# recipe:bf16 ...").

HellaSwag (a run trained with -h 1): "s:STEP eval:ACC", the accuracy at each validation step. When any run has
such lines the table gets a column of the accuracy at the last step and the highest, and the PNG a second
panel of the accuracy over steps.

FP8 quantization telemetry: a run trained with -lq N has, every N steps, one line per quantized tensor,
"s:STEP lq:l3.fc.dy amax:A scale:S sat:F ftz:F" (layer 3, linear qkv|attproj|fc|fcproj, role w|x|dy:
weight and activation in E4M3, output gradient in E5M2; sat = fraction of values that saturated to the
format's largest value, ftz = fraction flushed to zero). For every run with such lines a short summary
is printed: at the run's last telemetry step, per role, the largest sat and ftz over all tensors and
which tensor had it. --telemetry PNG draws, per run with telemetry, a 3x3 grid (rows: the roles w, x,
dy; columns: amax, sat, ftz over steps), one line per tensor: color = layer, line style = linear.
With one run that has telemetry the PNG is written as named; with several, one PNG per such run,
named with the run's 1-based position on the command line: quant.png -> quant_run1.png, quant_run3.png.
--telemetry with no telemetry in any run is an error (exit status 1).

Several seeds (--by-seed): one run per configuration and seed. A run's seed is the "seed:N" of its log's
metadata, or else (older logs have none) the end of its label ("bf16 sd0", "fast_seed2");
its configuration is the label without that end. The first run's configuration is the baseline. For
every other configuration the report gives, per seed, the lowest validation loss and the train loss of
steps 301-350 as ratios to the baseline's run with the same seed, then the mean of those ratios and their
sample standard deviation (one seed's spread) and the 95% confidence interval of that mean (Student's t
with n-1 degrees of freedom, seeds taken as independent draws), and the mean over the seeds of each
configuration's two figures. With --table it is written after the main table. With --out the PNG is drawn per
configuration rather than per run (one color each): the mean train loss over the seeds (smoothed), the
validation losses (each seed thin, their mean bold), and each configuration's validation loss divided by the
baseline's of the same seed at every validation step (the mean over the seeds, with a band from the lowest to
the highest seed).

Boundary telemetry (the q115 recipe): "s:STEP lq:q115.BOUNDARY clamp:F ftz:F amax:A", one line per
forward boundary (embedding, norm, qkv, scores, softmax, ...). Each such run gets a summary (the
clamped fraction of every boundary at its first and last telemetry step) and, with --telemetry, a PNG
of clamp, ftz and amax over steps, one line per boundary (named like the FP8 telemetry PNGs).
"""
import argparse
import math
import os
import re
import sys


def parse_main_log(path):
    """Returns (train {step: loss}, val {step: loss}, meta {key: value}). A resumed run appends to its
    main.log; a step logged twice keeps the last value (the resumed run's). Telemetry lines
    ("s:STEP lq:...") are not losses and are skipped here; parse_telemetry reads them."""
    train, val, meta = {}, {}, {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            if line.startswith("#"):
                for item in line[1:].split():
                    if ":" in item:
                        k, v = item.split(":", 1)
                        meta[k] = v
                continue
            fields = dict(item.split(":", 1) for item in line.split() if ":" in item)
            if "s" not in fields or "lq" in fields:
                continue
            step = int(fields["s"])
            if "trl" in fields:
                train[step] = float(fields["trl"])
            if "tel" in fields:
                val[step] = float(fields["tel"])
    return train, val, meta


def parse_eval(path):
    """The HellaSwag accuracy of a main.log as {step: accuracy}, from lines "s:STEP eval:ACC" (the trainer's -h 1,
    llm.c's format); a step logged twice (a resumed run appends) keeps the last line; {} when none."""
    acc = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            fields = dict(item.split(":", 1) for item in line.split() if ":" in item)
            if "s" in fields and "eval" in fields:
                try:
                    acc[int(fields["s"])] = float(fields["eval"])
                except ValueError:
                    continue
    return acc


def summarize_eval(acc):
    """{"last_eval", "last_eval_step", "max_eval", "max_eval_step"} of a run's HellaSwag accuracy ({} without)."""
    if not acc:
        return {}
    last, best = max(acc), max(acc, key=lambda s: (acc[s], -s))
    return {"last_eval": acc[last], "last_eval_step": last, "max_eval": acc[best], "max_eval_step": best}


# FP8 telemetry: the order of the roles (plot rows) and linears (line styles) as the trainer logs them
TEL_ROLES = ("w", "x", "dy")
TEL_ROLE_NAMES = {"w": "w (weight, E4M3)", "x": "x (activation, E4M3)", "dy": "dy (output gradient, E5M2)"}
TEL_LINEARS = ("qkv", "attproj", "fc", "fcproj")
TEL_LINESTYLES = {"qkv": "-", "attproj": "--", "fc": ":", "fcproj": "-."}
TEL_QUANTITIES = ("amax", "scale", "sat", "err", "ftz")
# NVFP4 logs "s:STEP lq:l3.fc.dy amax:A err:E ftz:F" (err = relative RMS quantization error) and the
# roles w, x, x_wgrad, dy, dy_wgrad
TEL_ROLE_NAMES.update({"x_wgrad": "x_wgrad (activation, wgrad operand)", "dy_wgrad": "dy_wgrad (gradient, wgrad operand)"})


def parse_telemetry(path):
    """Returns the FP8 quantization telemetry of a main.log as {(layer, linear, role): {step: {quantity:
    value}}}, e.g. {(3, "fc", "dy"): {100: {"amax": 0.0123, "scale": 4.6e6, "sat": 0.0, "ftz": 0.00125}}},
    from lines "s:STEP lq:l3.fc.dy amax:... scale:... sat:... ftz:...". Values go through float(), so a
    broken run's "nan", "-nan" or "inf" becomes a float nan/inf; a quantity missing from a line is left out
    of its dict. As in parse_main_log, a step logged twice (a resumed run appends) keeps the last line.
    Lines whose tensor name or numbers do not parse are skipped. {} when the log has no telemetry."""
    tel = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = dict(item.split(":", 1) for item in line.split() if ":" in item)
            if "s" not in fields or "lq" not in fields:
                continue
            parts = fields["lq"].split(".")
            if len(parts) != 3 or not parts[0].startswith("l"):
                continue
            try:
                step, layer = int(fields["s"]), int(parts[0][1:])
                values = {q: float(fields[q]) for q in TEL_QUANTITIES if q in fields}
            except ValueError:
                continue
            tel.setdefault((layer, parts[1], parts[2]), {})[step] = values
    return tel


def parse_boundary_telemetry(path):
    """Returns the boundary telemetry of a main.log (q115) as {boundary: {step: {quantity: value}}} from
    lines "s:STEP lq:q115.norm clamp:F ftz:F amax:A"; the last line of a step wins; {} when none."""
    tel = {}
    with open(path) as f:
        for line in f:
            fields = dict(item.split(":", 1) for item in line.split() if ":" in item)
            if "s" not in fields or not fields.get("lq", "").startswith("q115."):
                continue
            try:
                step = int(fields["s"])
                values = {q: float(fields[q]) for q in ("clamp", "ftz", "amax") if q in fields}
            except ValueError:
                continue
            tel.setdefault(fields["lq"][len("q115."):], {})[step] = values
    return tel


def boundary_telemetry_lines(label, path, tel):
    """The clamped fraction of every boundary at the first and the last telemetry step, as text lines."""
    steps = sorted({s for per in tel.values() for s in per})
    first, last = steps[0], steps[-1]
    lines = [f"Boundary telemetry {label} ({path}): clamped fraction at step {first} -> step {last}"]
    for b, per in tel.items():
        a, z = per.get(first, {}).get("clamp", math.nan), per.get(last, {}).get("clamp", math.nan)
        lines.append(f"  {b:<10} {a:.3e} -> {z:.3e}   (amax {per.get(last, {}).get('amax', math.nan):.3g})")
    return lines


def plot_boundary_telemetry(png, label, tel):
    """One row of three panels (clamp, ftz on symlog axes; amax on a log axis) over steps, a line per boundary."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    cols = (("clamp", "clamp (fraction clamped at +-0.999 x range)"), ("ftz", "ftz (fraction flushed to zero)"),
            ("amax", "amax (abs max before quantization)"))
    for i, b in enumerate(tel):
        steps = sorted(tel[b])
        for ax, (q, _) in zip(axes, cols):
            ys = [tel[b][s].get(q, math.nan) for s in steps]
            ax.plot(steps, ys, color=f"C{i % 10}", ls="-" if i < 10 else "--", marker=".", lw=1.2, label=b)
    for ax, (q, title) in zip(axes, cols):
        if q == "amax":
            ax.set_yscale("log")
        else:
            ax.set_yscale("symlog", linthresh=1e-6)
            ax.set_ylim(bottom=0)
        ax.set_title(title)
        ax.set_xlabel("step (main.log s:)")
        ax.grid(alpha=0.3)
    axes[2].legend(fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5), title="boundary")
    fig.suptitle(f"{label}: forward-boundary telemetry")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def tensor_name(key):
    """(3, "fc", "dy") -> "l3.fc.dy", the name the trainer logs."""
    layer, linear, role = key
    return f"l{layer}.{linear}.{role}"


def telemetry_summary(tel):
    """Returns (step, {role: {"sat": (value, tensor or None), "ftz": (value, tensor or None), "nonfinite":
    [tensors whose amax is nan/inf]}}) for the last step at which any tensor has telemetry: per role, the
    largest sat and ftz over all tensors of that role and the tensor that had it (the first in layer/linear
    order on ties; None when every value is 0). Non-finite sat/ftz values are ignored for the maxima.
    (None, {}) without telemetry."""
    steps = [s for per_step in tel.values() for s in per_step]
    if not steps:
        return None, {}
    last = max(steps)
    order = {name: i for i, name in enumerate(TEL_LINEARS)}
    keys = sorted((k for k in tel if last in tel[k]), key=lambda k: (k[0], order.get(k[1], len(order)), k[1]))
    out = {}
    for role in TEL_ROLES + tuple(sorted({k[2] for k in keys} - set(TEL_ROLES))):
        rk = [k for k in keys if k[2] == role]
        if not rk:
            continue
        entry = {"nonfinite": [tensor_name(k) for k in rk if not math.isfinite(tel[k][last].get("amax", 0.0))]}
        has_err = any("err" in tel[k][last] for k in rk)
        for q in ("sat", "ftz") + (("err",) if has_err else ()):
            best, who = 0.0, None
            for k in rk:
                v = tel[k][last].get(q, 0.0)
                if math.isfinite(v) and v > best:
                    best, who = v, tensor_name(k)
            entry[q] = (best, who)
        out[role] = entry
    return last, out


def telemetry_lines(label, path, tel):
    """The text summary of one run's telemetry (see telemetry_summary), as lines for stdout."""
    step, summary = telemetry_summary(tel)
    n = sum(1 for per_step in tel.values() if step in per_step)
    kind = "Quantization" if any("err" in v for per_step in tel.values() for v in per_step.values()) else "FP8"
    lines = [f"{kind} telemetry {label} ({path}): last telemetry step {step}, {n} tensors"]
    for role, e in summary.items():
        (sat, sat_t), (ftz, ftz_t) = e["sat"], e["ftz"]
        if "err" in e:  # NVFP4: relative error instead of saturation (FP4 saturates only by design)
            err, err_t = e["err"]
            row = f"  {role:<2}: max err {err:.3e} ({err_t or 'none'})  max ftz {ftz:.3e} ({ftz_t or 'none'})"
        else:
            row = f"  {role:<2}: max sat {sat:.3e} ({sat_t or 'none'})  max ftz {ftz:.3e} ({ftz_t or 'none'})"
        if e["nonfinite"]:
            shown = ", ".join(e["nonfinite"][:4]) + (", ..." if len(e["nonfinite"]) > 4 else "")
            row += f"  non-finite amax in {len(e['nonfinite'])}: {shown}"
        lines.append(row)
    return lines


def plot_telemetry(png, label, tel):
    """Draws one run's telemetry to png: a 3x3 grid, rows = roles (w, x, dy), columns = amax, sat, ftz
    against the main.log step. Every tensor is its own line: color = layer (viridis, shallow to deep), line
    style = linear (qkv solid, attproj dashed, fc dotted, fcproj dash-dot); one legend of layers and one of
    linears for the whole figure. amax is on a log axis (nan/inf/<=0 values leave a gap; steps where some
    tensor of the role had a nan/inf amax get a red vertical line); sat and ftz are fractions on a symlog
    axis (linear below 1e-6, so 0 stays visible, logarithmic above)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    layers = sorted({k[0] for k in tel})
    cmap = plt.get_cmap("viridis")
    color = {l: cmap(i / max(1, len(layers) - 1) * 0.9) for i, l in enumerate(layers)}
    present = {q for per_step in tel.values() for v in per_step.values() for q in v}
    cols = (("amax", "amax (abs max)"),)
    if "sat" in present or "err" not in present:
        cols += (("sat", "sat (fraction saturated)"),)
    if "err" in present:
        cols += (("err", "err (relative RMS quantization error)"),)
    cols += (("ftz", "ftz (fraction flushed to zero)"),)
    roles = TEL_ROLES + tuple(sorted({k[2] for k in tel} - set(TEL_ROLES)))
    fig, axes = plt.subplots(len(roles), len(cols), figsize=(16, 3.5 * len(roles)), sharex=True, squeeze=False)
    for r, role in enumerate(roles):
        keys = sorted(k for k in tel if k[2] == role)
        bad_steps = sorted({s for k in keys for s, v in tel[k].items() if not math.isfinite(v.get("amax", 0.0))})
        for c, (q, title) in enumerate(cols):
            ax = axes[r][c]
            any_positive = False
            for k in keys:
                steps = sorted(tel[k])
                ys = [tel[k][s].get(q, math.nan) for s in steps]
                if q == "amax":
                    ys = [y if math.isfinite(y) and y > 0 else math.nan for y in ys]
                any_positive = any_positive or any(y > 0 for y in ys if math.isfinite(y))
                ax.plot(steps, ys, color=color[k[0]], ls=TEL_LINESTYLES.get(k[1], "-"), lw=1.0)
            if q == "amax":
                for s in bad_steps:
                    ax.axvline(s, color="red", lw=0.8, alpha=0.6)
                if any_positive:
                    ax.set_yscale("log")
            elif "err" in present:  # NVFP4: errors and flush fractions are 1e-3..1, a log axis shows them
                if any_positive:
                    ax.set_yscale("log")
            else:
                ax.set_yscale("symlog", linthresh=1e-6)
                ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            if r == 0:
                ax.set_title(title)
            if c == 0:
                ax.set_ylabel(role if "err" in present else TEL_ROLE_NAMES.get(role, role))
            if r == len(roles) - 1:
                ax.set_xlabel("step (main.log s:)")
    layer_handles = [Line2D([], [], color=color[l], lw=2) for l in layers]
    fig.legend(layer_handles, [f"layer {l}" for l in layers], loc="center right", title="color: layer",
               fontsize="small", ncol=1 if len(layers) <= 24 else 2)
    linear_handles = [Line2D([], [], color="black", ls=TEL_LINESTYLES[n]) for n in TEL_LINEARS]
    fig.legend(linear_handles, TEL_LINEARS, loc="upper right", title="line style: linear", fontsize="small")
    any_bad = any(not math.isfinite(v.get("amax", 0.0)) for per_step in tel.values() for v in per_step.values())
    fig.suptitle(f"{label}: quantization telemetry per tensor (color: layer, line style: linear"
                 + ("; red line: a nan/inf amax" if any_bad else "") + ")")
    fig.tight_layout(rect=(0, 0, 0.88, 0.96))
    fig.savefig(png, dpi=110)
    plt.close(fig)


def telemetry_png_name(png, index, several):
    """The PNG for the run at 1-based command-line position index: png itself when only one run has
    telemetry, else png with "_run<index>" before the extension (quant.png -> quant_run2.png)."""
    if not several:
        return png
    stem, ext = os.path.splitext(png)
    return f"{stem}_run{index}{ext or '.png'}"


def mean_over(d, lo, hi):
    """Mean of d[step] for lo <= step <= hi (steps as the trainer prints them, 1-based); None if none."""
    # main.log's train step s is the (s+1)-th update, printed as "step s+1" by the trainer
    vals = [v for s, v in d.items() if lo <= s + 1 <= hi]
    return sum(vals) / len(vals) if vals else None


def summarize(train, val):
    out = {}
    if val:
        best_step = min(val, key=lambda s: (val[s], s))
        out["min_val"], out["min_val_step"] = val[best_step], best_step
        last = max(val)
        out["last_val"], out["last_val_step"] = val[last], last
    out["train_301_350"] = mean_over(train, 301, 350)
    if train:
        n = max(train) + 1
        out["train_last50"] = mean_over(train, n - 49, n)
    return out


def fmt(x, nd=4):
    return "n/a" if x is None else f"{x:.{nd}f}"


def report(runs):
    """runs: list of (label, summary). Returns markdown lines."""
    base = runs[0][1]
    with_eval = any("last_eval" in s for _, s in runs)
    lines = ["| run | lowest val loss (step) | train loss 301-350 | train loss last 50 | val loss at end (step) |"
             + (" val vs first | train 301-350 vs first |" if len(runs) > 1 else "")
             + (" HellaSwag at end (step) | highest HellaSwag (step) |" if with_eval else ""),
             "| --- | --- | --- | --- | --- |" + (" --- | --- |" if len(runs) > 1 else "") + (" --- | --- |" if with_eval else "")]
    for label, s in runs:
        row = (f"| {label} | {fmt(s.get('min_val'))} ({s.get('min_val_step', 'n/a')}) | {fmt(s.get('train_301_350'))} | "
               f"{fmt(s.get('train_last50'))} | {fmt(s.get('last_val'))} ({s.get('last_val_step', 'n/a')}) |")
        if len(runs) > 1:
            def ratio(k):
                a, b = s.get(k), base.get(k)
                return "n/a" if a is None or not b else f"{a / b:.4f}"
            row += f" {ratio('min_val')} | {ratio('train_301_350')} |"
        if with_eval:
            row += (f" {fmt(s.get('last_eval'))} ({s.get('last_eval_step', 'n/a')}) |"
                    f" {fmt(s.get('max_eval'))} ({s.get('max_eval_step', 'n/a')}) |")
        lines.append(row)
    return lines


def split_seed(label, meta):
    """(configuration, seed) of a run (see the top of the file): the label without a trailing seed marker
    ("sd3", "seed 3", "_sd3") and the seed it names; else the label and the log's "seed:N" metadata; else
    (label, None)."""
    m = re.match(r"^(.*?)[\s_-]*(?:sd|seed)[\s=:]?(\d+)$", label)
    if m and m.group(1):
        return m.group(1), int(m.group(2))
    if "seed" in meta and meta["seed"].isdigit():
        return label, int(meta["seed"])
    return label, None


def mean_sd(xs):
    """(mean, sample standard deviation or None for fewer than 2 values)"""
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else None
    return m, sd


# Two-sided 95% quantiles of Student's t, t(0.975, df), for df = 1..30 (standard tables, three decimals).
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t975(df):
    """t(0.975, df): the table above for df <= 30; beyond it the Cornish-Fisher expansion around z = 1.959964,
    z + (z^3 + z) / (4 df) + (5 z^5 + 16 z^3 + 3 z) / (96 df^2), which is within 0.001 of the exact value there."""
    if df < 1:
        raise ValueError("t975: df must be >= 1")
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df * df)


def mean_interval95(xs):
    """The 95% confidence interval of the mean of xs (seeds as independent draws): mean -/+ t(0.975, n-1) sd / sqrt(n);
    None for fewer than 2 values."""
    if len(xs) < 2:
        return None
    m, sd = mean_sd(xs)
    half = t975(len(xs) - 1) * sd / math.sqrt(len(xs))
    return m - half, m + half


def seed_report(entries):
    """entries: (configuration, seed, summary) per run, in command-line order; the first configuration is the
    baseline. Returns markdown lines (see the top of the file), or raises ValueError for a run without a seed
    or a configuration with two runs of one seed."""
    configs, runs = [], {}
    for config, seed, summary in entries:
        if seed is None:
            raise ValueError(f"--by-seed: run '{config}' names no seed (no 'seed:N' in its log, no 'sdN' ending its label)")
        if (config, seed) in runs:
            raise ValueError(f"--by-seed: two runs of '{config}' with seed {seed}")
        if config not in configs:
            configs.append(config)
        runs[(config, seed)] = summary
    base = configs[0]
    seeds = sorted(sd for c, sd in runs if c == base)
    keys = ("min_val", "train_301_350")
    lines = [f"Per seed, the ratio to the same seed's {base} run (lowest val loss / train loss 301-350), then the mean "
             "of the ratios (sample sd) and its 95% confidence interval (Student's t over the seeds):", "",
             "| run | " + " | ".join(f"seed {sd}" for sd in seeds) + " | mean of the ratios (sd) | 95% interval of the mean |",
             "| --- | " + " | ".join("---" for _ in seeds) + " | --- | --- |"]
    for config in configs[1:]:
        cells, ratios = [], {k: [] for k in keys}
        for sd in seeds:
            s, b = runs.get((config, sd)), runs[(base, sd)]
            r = {}
            for k in keys:
                if s is not None and s.get(k) is not None and b.get(k):
                    r[k] = s[k] / b[k]
                    ratios[k].append(r[k])
            cells.append(" / ".join(f"{r[k]:.4f}" if k in r else "n/a" for k in keys))
        summary, intervals = [], []
        for k in keys:
            if not ratios[k]:
                summary.append("n/a")
                intervals.append("n/a")
                continue
            m, sdev = mean_sd(ratios[k])
            summary.append(f"{m:.4f}" + (f" ({sdev:.4f})" if sdev is not None else ""))
            ci = mean_interval95(ratios[k])
            intervals.append(f"{ci[0]:.4f}-{ci[1]:.4f}" if ci else "n/a")
        lines.append(f"| {config} | " + " | ".join(cells) + " | " + " / ".join(summary) + " | " + " / ".join(intervals) + " |")
    lines += ["", "| run | seeds | mean lowest val loss | mean train loss 301-350 |", "| --- | ---: | ---: | ---: |"]
    for config in configs:
        mine = [runs[(c, sd)] for c, sd in runs if c == config]
        vals = [m[k] for m in mine for k in keys[:1] if m.get(k) is not None]
        trains = [m[k] for m in mine for k in keys[1:] if m.get(k) is not None]
        lines.append(f"| {config} | {len(mine)} | {fmt(mean_sd(vals)[0] if vals else None)} | "
                     f"{fmt(mean_sd(trains)[0] if trains else None)} |")
    return lines


def moving_average(ys, window):
    """Trailing mean over the last `window` values (fewer at the start)."""
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def seed_curves(entries, smooth=25):
    """The curves of a --by-seed PNG. entries: (configuration, seed, train {step: loss}, val {step: loss}) per run in
    command-line order; the first configuration is the baseline. Returns, per configuration in order,
    (configuration, seeds, data) with
      data["train"]: (steps, the mean over the seeds of the train loss, then a trailing `smooth`-step mean), over
                     the steps every seed logged;
      data["val"]:   (steps, the mean over the seeds), over the validation steps every seed logged, and
                     data["val_runs"] the seeds' own (steps, losses);
      data["ratio"]: (steps, mean, lowest, highest) over the seeds of val / the baseline's val of the same seed,
                     at the validation steps both logged, for the seeds the baseline has (not for the baseline)."""
    configs, runs = [], {}
    for config, seed, train, val in entries:
        if config not in configs:
            configs.append(config)
        runs.setdefault(config, {})[seed] = (train, val)
    base = runs[configs[0]]
    out = []
    for config in configs:
        mine = runs[config]
        data = {}
        steps = sorted(set.intersection(*(set(t) for t, _ in mine.values())))
        if steps:
            mean = [sum(t[s] for t, _ in mine.values()) / len(mine) for s in steps]
            data["train"] = (steps, moving_average(mean, smooth))
        vsteps = sorted(set.intersection(*(set(v) for _, v in mine.values())))
        if vsteps:
            data["val"] = (vsteps, [sum(v[s] for _, v in mine.values()) / len(mine) for s in vsteps])
        data["val_runs"] = [(sorted(v), [v[s] for s in sorted(v)]) for _, v in mine.values()]
        if config != configs[0]:
            paired = [sd for sd in mine if sd in base]
            rsteps = sorted(set.intersection(*(set(mine[sd][1]) & set(base[sd][1]) for sd in paired))) if paired else []
            rsteps = [s for s in rsteps if all(base[sd][1][s] for sd in paired)]
            if rsteps:
                per = [[mine[sd][1][s] / base[sd][1][s] for sd in paired] for s in rsteps]
                data["ratio"] = (rsteps, [sum(r) / len(r) for r in per], [min(r) for r in per], [max(r) for r in per])
        out.append((config, sorted(mine), data))
    return out


def plot_seed_curves(png, curves):
    """Three panels: the mean train loss per configuration (smoothed), the validation loss (each seed thin, the
    mean bold), and each configuration's validation loss over the baseline's of the same seed (mean, and the band
    from the lowest to the highest seed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_t, ax_v, ax_r) = plt.subplots(1, 3, figsize=(18, 5.2))
    base = curves[0][0]
    for k, (config, seeds, data) in enumerate(curves):
        color, name = f"C{k % 10}", f"{config} ({len(seeds)} seeds)"
        if "train" in data:
            ax_t.plot(data["train"][0], data["train"][1], color=color, lw=1.4, label=name)
        for steps, losses in data["val_runs"]:
            ax_v.plot(steps, losses, color=color, lw=0.7, alpha=0.3)
        if "val" in data:
            ax_v.plot(data["val"][0], data["val"][1], color=color, lw=2.0, marker="o", ms=3, label=name)
        if "ratio" in data:
            steps, mean, lo, hi = data["ratio"]
            ax_r.fill_between(steps, lo, hi, color=color, alpha=0.18, lw=0)
            ax_r.plot(steps, mean, color=color, lw=2.0, marker="o", ms=3, label=f"{name}: mean, band lowest-highest seed")
    ax_r.axhline(1.0, color="k", lw=0.8)
    ax_t.set_title("train loss, mean over seeds (25-step moving average)")
    ax_v.set_title("validation loss (thin: each seed; bold: mean)")
    ax_r.set_title(f"validation loss / {base}'s of the same seed")
    for ax in (ax_t, ax_v, ax_r):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def plot_eval(ax, evals):
    """The HellaSwag accuracy of every run with some, over steps, on ax (a run keeps its color of the loss panel),
    with chance (0.25, four endings) as a line."""
    for k, (label, acc) in enumerate(evals):
        if acc:
            steps = sorted(acc)
            ax.plot(steps, [acc[s] for s in steps], color=f"C{k % 10}", marker="o", ms=3, lw=1.6, label=label)
    ax.axhline(0.25, color="k", lw=0.8, ls="--", label="chance (4 endings)")
    ax.set_xlabel("step")
    ax.set_ylabel("HellaSwag accuracy (acc_norm)")
    ax.set_title("HellaSwag (main.log eval:)")
    ax.grid(alpha=0.3)
    ax.legend()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories (with main.log) or main.log files; the first is the baseline")
    ap.add_argument("--labels", help="comma-separated labels (default: the recipe in each log, else the path)")
    ap.add_argument("--out", help="PNG with the train and validation curves of all runs")
    ap.add_argument("--table", help="write the summary table (markdown) here")
    ap.add_argument("--by-seed", action="store_true", help="several seeds per configuration: per-seed ratios to the "
                    "first run's configuration, their mean and sd (see the top)")
    ap.add_argument("--telemetry", metavar="PNG", help="PNG of the FP8 quantization telemetry (amax, sat, ftz per "
                    "tensor); one per run with telemetry, suffixed _runN when several runs have it")
    args = ap.parse_args(argv)
    labels = args.labels.split(",") if args.labels else []
    if labels and len(labels) != len(args.runs):
        ap.error(f"--labels has {len(labels)} names for {len(args.runs)} runs")
    runs, curves, telemetry, seeded, evals = [], [], [], [], []
    for i, r in enumerate(args.runs):
        path = os.path.join(r, "main.log") if os.path.isdir(r) else r
        if not os.path.isfile(path):
            print(f"error: {path} not found", file=sys.stderr)
            return 1
        train, val, meta = parse_main_log(path)
        if not train and not val:
            print(f"error: {path} has no 's:STEP trl:' or 's:STEP tel:' lines", file=sys.stderr)
            return 1
        label = labels[i] if labels else meta.get("recipe", r)
        acc = parse_eval(path)
        runs.append((label, dict(summarize(train, val), **summarize_eval(acc))))
        seeded.append(split_seed(label, meta) + (runs[-1][1],))
        curves.append((label, train, val))
        evals.append((label, acc))
        tel = parse_telemetry(path)
        if tel:
            telemetry.append((i + 1, label, path, tel))
        btel = parse_boundary_telemetry(path)
        if btel:
            telemetry.append((i + 1, label, path, btel))
    if args.telemetry and not telemetry:
        print("error: --telemetry: no run has FP8 quantization telemetry ('s:STEP lq:...' lines in main.log; "
              "train the fp8 recipe with -lq N)", file=sys.stderr)
        return 1
    lines = report(runs)
    if args.by_seed:
        try:
            lines += [""] + seed_report(seeded)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    print("\n".join(lines))
    for _, label, path, tel in telemetry:
        is_boundary = not isinstance(next(iter(tel)), tuple)
        print("\n".join((boundary_telemetry_lines if is_boundary else telemetry_lines)(label, path, tel)))
    if args.table:
        with open(args.table, "w") as f:
            f.write("\n".join(lines) + "\n")
    if args.out and args.by_seed:
        plot_seed_curves(args.out, seed_curves([(c, sd, tr, va) for (c, sd, _), (_, tr, va) in zip(seeded, curves)]))
        print(f"wrote {args.out}")
    elif args.out:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        with_eval = any(acc for _, acc in evals)
        if with_eval:
            fig, (ax, ax_eval) = plt.subplots(1, 2, figsize=(16, 5.5))
            plot_eval(ax_eval, evals)
        else:
            fig, ax = plt.subplots(figsize=(9, 5.5))
        for k, (label, train, val) in enumerate(curves):
            color = f"C{k % 10}"
            st = sorted(train)
            ax.plot([s + 1 for s in st], [train[s] for s in st], color=color, alpha=0.35, lw=0.8)
            sv = sorted(val)
            ax.plot(sv, [val[s] for s in sv], color=color, marker="o", ms=3, lw=1.6, label=f"{label} (val)")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (faint: train, markers: validation)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out, dpi=120)
        print(f"wrote {args.out}")
    if args.telemetry:
        for index, label, _, tel in telemetry:
            png = telemetry_png_name(args.telemetry, index, len(telemetry) > 1)
            (plot_boundary_telemetry if not isinstance(next(iter(tel)), tuple) else plot_telemetry)(png, label, tel)
            print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
