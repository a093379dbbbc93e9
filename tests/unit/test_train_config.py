"""The typed training configuration and the clear errors for bad input."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from training.config import TrainConfig, build_parser, parse_config
from training.lifecycle import check_chat_template, check_not_empty, load_data


def test_every_flag_has_a_default_and_help():
    parser = build_parser()
    for action in parser._actions:
        if action.dest in ("help",):
            continue
        assert action.help and len(action.help) > 10, action.dest
    text = parser.format_help()  # renders (no stray % in help strings)
    assert "--zero-stage" in text and "--lora-r" in text
    fields = set(TrainConfig.__dataclass_fields__)
    assert fields <= {a.dest for a in parser._actions}


def test_yaml_then_flags_override_and_resolved_config_round_trips(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 0.002\nmix: math\nzero-stage: 3\neval_at_start: false\n")
    cfg = parse_config(["--config", str(path), "--lr", "5e-4", "--local_rank=1"])
    assert (cfg.lr, cfg.mix, cfg.zero_stage, cfg.eval_at_start) == (5e-4, "math", 3, False)
    cfg.save(tmp_path)
    again = parse_config(["--config", str(tmp_path / "training_config.yaml")])
    assert again == cfg
    assert parse_config([]).resolved_output_dir().as_posix() == "runs/drafter"


@pytest.mark.parametrize("text, match", [
    ("learning_rate: 0.1\n", r"unknown training option\(s\) \['learning_rate'\]"),
    ("lr: fast\n", "option lr expects float"),
    ("zero_stage: 4\n", r"zero_stage must be one of \[0, 1, 2, 3\]"),
    ("tokens_per_batch: 0\n", "tokens_per_batch must be >= 1"),
    ("- a\n- b\n", "expected a mapping"),
])
def test_bad_config_files_are_clear_errors(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        parse_config(["--config", str(path)])


def test_bad_flags_and_inputs_are_clear_errors(tmp_path):
    with pytest.raises(SystemExit):
        parse_config(["--objective", "medusa"])
    with pytest.raises(FileNotFoundError, match="no such file"):
        parse_config(["--config", str(tmp_path / "missing.yaml")])
    with pytest.raises(ValueError, match="resume must be 'auto' or an existing checkpoint"):
        parse_config(["--resume", str(tmp_path / "nope")])
    with pytest.raises(ValueError, match=r"unknown mix 'mathy'.*balanced"):
        load_data(TrainConfig(mix="mathy"), tokenizer=None)
    with pytest.raises(ValueError, match="no chat template.*--chat-template"):
        check_chat_template(SimpleNamespace(chat_template=None), TrainConfig())
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    tok = SimpleNamespace(chat_template=None)
    check_chat_template(tok, TrainConfig(chat_template=str(template)))
    assert "messages" in tok.chat_template
    import datasets

    empty = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]], "loss_mask": [[0, 0, 0]]})
    with pytest.raises(ValueError, match="empty after filtering"):
        check_not_empty(empty, "training", TrainConfig())
