"""Run folders as train.py leaves them, hand-made, for the tests of compare_runs.py and scaling.py."""

import json

from omegaconf import OmegaConf

OK = {"status": "ok", "final/tokens_per_s_median": 125_700.0, "final/step_ms_median": 130.3,
      "final/peak_mem_gib": 40.5, "final/mfu_median": 0.41, "final/val_loss": 3.21, "final/train_loss": 3.3}


def fake_run(root, name, attention, seq_len, summary=None, steps=3, backend=None, **config):
    """Hydra's config, metrics.jsonl (steps, then the summary line), summary.json."""
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    att = {"name": attention, **({"backend": backend} if backend else {})}
    cfg = {"attention": att, "seq_len": seq_len, "model": {"name": "gpt2-medium"}, **config}
    OmegaConf.save(OmegaConf.create(cfg), run / ".hydra" / "config.yaml")
    lines = [json.dumps({"step": i + 1, "train/loss": 5.0 - i}) for i in range(steps)]
    if summary is not None:
        lines.append(json.dumps({"summary": summary}))
        (run / "summary.json").write_text(json.dumps(summary))
    if lines:
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run
