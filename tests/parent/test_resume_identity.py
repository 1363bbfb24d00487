"""A resume reads the rows the interrupted run would have read, or is refused: the data state in
each checkpoint carries the data's identity (records, which of them train, tokenizer, template,
masks, seq_len, packing, seed), and a resume on other data is refused by pre-flight before any
process starts (naming the key, the value it was written with, and the fix) and by each rank as it
loads. A sample waiting for a row never makes a row longer than seq_len."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import resolve

from qwen3_trainium.data.chat import source
from qwen3_trainium.parent import compose, preflight
from qwen3_trainium.parent.preflight.resume_data import check_resume_data

CHAT = ("data=chat", "smoke=on", "checkpoint=resume")


def _chat_copy(tmp_path, n: int = 40, name: str = "chat") -> str:
    """The first n shipped conversations in a directory of their own."""
    from qwen3_trainium.data import assets

    lines = (assets.CHAT_DIR / "train.jsonl").read_text().splitlines()[:n]
    path = tmp_path / name
    path.mkdir()
    (path / "train.jsonl").write_text("\n".join(lines) + "\n")
    return str(path)


def _state_after(run, rows: int = 3) -> dict:
    stream = source.stream(run)
    for _ in range(rows):
        stream.next_row()
    return stream.state_dict()


CHANGES = [
    ("training.seq_len=512", "training.seq_len"),
    ("data.packing=false", "data.packing"),
    ("debug.seed=7", "debug.seed"),
    ("data.loss_on=all", "data.loss_on"),
    ("data.overflow=truncate", "data.overflow"),
    ("+data.chat_template_kwargs.enable_thinking=false", "data.chat_template_kwargs"),
]


@pytest.mark.parametrize(("override", "key"), CHANGES)
def test_a_rank_refuses_a_chat_state_written_with_another_setting(tmp_path, override, key):
    data = f"data.dataset_path={_chat_copy(tmp_path)}"
    state = _state_after(resolve(*CHAT, data))
    source.stream(resolve(*CHAT, data)).load_state_dict(state)  # the same data: resumes
    with pytest.raises(ValueError, match=f"{key}: .* when the checkpoint was written"):
        source.stream(resolve(*CHAT, data, override)).load_state_dict(state)


def test_a_rank_refuses_a_chat_state_of_other_records_or_template(tmp_path):
    path = _chat_copy(tmp_path)
    state = _state_after(resolve(*CHAT, f"data.dataset_path={path}"))
    moved = shutil.copytree(path, tmp_path / "moved")  # the same records elsewhere: the same data
    source.stream(resolve(*CHAT, f"data.dataset_path={moved}")).load_state_dict(state)
    edited = _chat_copy(tmp_path, n=41, name="edited")
    with pytest.raises(ValueError, match="data.dataset_path: "):
        source.stream(resolve(*CHAT, f"data.dataset_path={edited}")).load_state_dict(state)
    template = tmp_path / "template.jinja"
    template.write_text(source.tokenizer(resolve(*CHAT)).template.replace("<|im_start|>", "<|im_start|> "))
    with pytest.raises(ValueError, match="data.chat_template: "):
        source.stream(
            resolve(*CHAT, f"data.dataset_path={path}", f"data.chat_template={template}")
        ).load_state_dict(state)


def test_a_waiting_sample_longer_than_seq_len_never_makes_a_longer_row(tmp_path):
    """A state from seq_len 256 whose waiting sample (read, did not fit the last row) has more
    than 128 tokens, loaded at 128: refused (the old stream emitted it whole, a row of more than
    128). Without an identity (a checkpoint written before identities) the rank still refuses it."""
    data = f"data.dataset_path={_chat_copy(tmp_path)}"
    stream = source.stream(resolve(*CHAT, data))
    while not (stream.pending and len(stream.pending[0][0]) > 128):
        stream.next_row()
    state = stream.state_dict()
    short = source.stream(resolve(*CHAT, data, "training.seq_len=128"))
    with pytest.raises(ValueError, match="training.seq_len: 256 when the checkpoint was written, 128 now"):
        short.load_state_dict(state)
    with pytest.raises(ValueError, match="past training.seq_len 128"):
        short.load_state_dict({k: v for k, v in state.items() if k != "identity"})


def test_a_rank_refuses_a_text_state_written_with_another_seq_len():
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from qwen3_trainium.data import text

    run = resolve("smoke=on", "training.seq_len=64")
    tok = HuggingFaceTokenizer.Config().build(tokenizer_path=run.data.hf_assets_path)

    def rows(seq_len: int):
        return text.TextRows(
            dataset_name=run.data.dataset,
            dataset_path=run.data.dataset_path,
            tokenizer=tok,
            seq_len=seq_len,
            dp_rank=0,
            dp_world_size=1,
            infinite=True,
            identity=text.identity(resolve("smoke=on", f"training.seq_len={seq_len}")),
        )

    first = rows(64)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    assert state["identity"]["seq_len"] == 64 and state["sample_idx"] > 0
    rows(64).load_state_dict(state)
    with pytest.raises(ValueError, match="training.seq_len: 64 when the checkpoint was written, 128 now"):
        rows(128).load_state_dict(state)


# -- pre-flight: a DCP step folder as torchtitan writes it (model and dataloader keys), in process


def _write_step(run, run_dir, step: int = 2) -> str:
    """checkpoint/step-N with the model's weights and rank 0's dataloader state, saved by DCP as
    torchtitan's CheckpointManager saves them (``{"dataloader": loader.state_dict(), **model}``)."""
    import torch.distributed.checkpoint as dcp

    from qwen3_trainium.data.loaders import dataloaders
    from qwen3_trainium.parent.preflight.titan import check_titan

    compose.save(run, str(run_dir))
    _, trial = check_titan(run, str(run_dir))
    model = trial.model_spec.model.build()
    train, _ = dataloaders(run, str(run_dir))
    loader = train.build(
        dp_world_size=1,
        dp_rank=0,
        tokenizer=_tokenizer(run),
        seq_len=run.training.seq_len,
        local_batch_size=1,
    )
    for _, _batch in zip(range(3), loader, strict=False):
        pass
    step_dir = run_dir / "checkpoint" / f"step-{step}"
    dcp.save(
        {**model.state_dict(), "dataloader": loader.state_dict()}, checkpoint_id=str(step_dir), no_dist=True
    )
    return str(step_dir)


def _tokenizer(run):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    return HuggingFaceTokenizer.Config().build(tokenizer_path=run.data.hf_assets_path)


def _metadata(step_dir: str) -> dict:
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(step_dir).read_metadata().state_dict_metadata


def test_preflight_refuses_a_resume_on_other_chat_data_naming_key_value_and_fix(tmp_path):
    data = f"data.dataset_path={_chat_copy(tmp_path)}"
    run_dir = tmp_path / "run"
    step_dir = _write_step(resolve(*CHAT, data), run_dir)
    notes: list[str] = []
    assert check_resume_data(resolve(*CHAT, data), step_dir, _metadata(step_dir), notes) == []
    for override, key in CHANGES:
        problems = check_resume_data(resolve(*CHAT, data, override), step_dir, _metadata(step_dir), notes)
        assert [p.key for p in problems] == [key], (override, problems)
        assert f"{step_dir} was written reading other data" in problems[0].message
        assert f"checkpoint.initial_load_path={step_dir}" in problems[0].fix
    problems = check_resume_data(resolve(*CHAT, data, "debug.seed=7"), step_dir, _metadata(step_dir), notes)
    assert problems[0].fix.startswith("debug.seed=42 to resume it")
    problems = preflight.check(resolve(*CHAT, data, "training.seq_len=512"), str(run_dir), launching=False)
    assert [p.key for p in problems] == ["training.seq_len"] and "(256 then)" in problems[0].message


def test_preflight_refuses_a_resume_at_another_data_parallel_world(tmp_path):
    data = f"data.dataset_path={_chat_copy(tmp_path)}"
    step_dir = _write_step(resolve(*CHAT, data), tmp_path / "run")
    problems = check_resume_data(resolve(*CHAT, data, "parallel=cpu2"), step_dir, _metadata(step_dir), [])
    assert [p.key for p in problems] == ["launcher.nproc_per_node"]
    assert "the data positions of 1 data-parallel ranks; this run has 2" in problems[0].message


def test_preflight_refuses_a_resume_on_other_text_data(tmp_path):
    from qwen3_trainium.data import assets

    corpus = tmp_path / "corpus"  # no validation file: eval=on holds out a fraction training skips
    corpus.mkdir()
    shutil.copy(assets.CORPUS_DIR / "train.jsonl", corpus / "train.jsonl")
    data = (
        "data=local",
        f"data.dataset_path={corpus}",
        "checkpoint=resume",
        "smoke=on",
        "training.seq_len=64",
    )
    step_dir = _write_step(resolve(*data), tmp_path / "run")
    assert check_resume_data(resolve(*data), step_dir, _metadata(step_dir), []) == []
    problems = check_resume_data(resolve(*data, "eval=on"), step_dir, _metadata(step_dir), [])
    assert [p.key for p in problems] == ["eval.enable"]
    assert "every record the fraction 0.05 picks" in problems[0].value
    with open(corpus / "train.jsonl", "a") as f:
        f.write(json.dumps({"text": "one more record"}) + "\n")
    problems = check_resume_data(resolve(*data), step_dir, _metadata(step_dir), [])
    assert [p.key for p in problems] == ["data.dataset_path"]


def _pairs_copy(tmp_path, n: int = 40) -> str:
    """The first n shipped preference pairs in a directory of their own."""
    from qwen3_trainium.data import assets

    lines = (assets.DATA_DIR / "preference_corpus" / "train.jsonl").read_text().splitlines()[:n]
    path = tmp_path / "pairs"
    path.mkdir()
    (path / "train.jsonl").write_text("\n".join(lines) + "\n")
    return str(path)


def test_preflight_refuses_a_resume_on_other_preference_data_naming_key_value_and_fix(tmp_path):
    """objective=dpo: the check reads the preference rows' identity (data/preference/source.py),
    not chat's, whose template settings (loss_on, history_thinking) preference rows do not have."""
    dpo = ("objective=dpo", "smoke=on", "checkpoint=resume", f"data.dataset_path={_pairs_copy(tmp_path)}")
    from qwen3_trainium.data.preference.masks import MASK_RULE
    from qwen3_trainium.parent.preflight.resume_data import our_identity

    assert our_identity(resolve(*dpo))["masks"] == MASK_RULE  # compared as objective.kind
    step_dir = _write_step(resolve(*dpo), tmp_path / "run")
    notes: list[str] = []
    assert check_resume_data(resolve(*dpo), step_dir, _metadata(step_dir), notes) == []
    for override, key in [("data.packing=false", "data.packing"), ("debug.seed=7", "debug.seed")]:
        problems = check_resume_data(resolve(*dpo, override), step_dir, _metadata(step_dir), notes)
        assert [p.key for p in problems] == [key], (override, problems)
        assert f"{step_dir} was written reading other data" in problems[0].message
