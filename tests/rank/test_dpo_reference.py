"""The DPO reference table (``rank/dpo_reference.py``, ``dpo_reference_key.py``): what its key
depends on, where it lives, its lookup, its atomic write, and the refusal of a resume without it.
Fast: no torchrun (the pre-pass's end-to-end is ``test_dpo_e2e.py``)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from conftest import ROOT, resolve

from qwen3_trainium.rank import dpo_reference as ref
from qwen3_trainium.rank import dpo_reference_key as refkey

TEMPLATE = ROOT / "tests" / "data" / "fixtures" / "qwen3_chat_template.jinja"


def _pair(i: int, chosen: str | None = None) -> dict:
    return {
        "prompt": [{"role": "user", "content": f"What is {i} plus 1?"}],
        "chosen": [{"role": "assistant", "content": chosen or f"{i} plus 1 is {i + 1}."}],
        "rejected": [{"role": "assistant", "content": f"It is {i + 7}."}],
    }


def _dataset(folder, n: int = 6, first: str | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(_pair(i, first if i == 0 else None)) for i in range(n)]
    (folder / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _run(dataset, *overrides: str):
    return resolve("objective=dpo", f"data.dataset_path={dataset}", *overrides)


def _checkpoint(folder, weights: bytes = b"\x00" * 64):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "config.json").write_text('{"model_type": "qwen3"}')
    return folder


def test_the_key_follows_data_template_checkpoint_model_path_and_dtype(tmp_path):
    data = _dataset(tmp_path / "data")
    base = refkey.key(_run(data), "train")
    assert refkey.key(_run(data), "train") == base  # the same run: the same table

    other = _dataset(tmp_path / "other", first="One plus one is two.")  # one record's text differs
    assert refkey.key(_run(other), "train") != base
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE.read_text().replace("<|im_start|>", "<|im_start|> "))
    assert refkey.key(_run(data, f"data.chat_template={template}"), "train") != base
    assert refkey.key(_run(data, "+data.chat_template_kwargs.enable_thinking=false"), "train") != base
    assert refkey.key(_run(data, "model=nki_moe"), "train") != base
    assert refkey.key(_run(data, "training.mixed_precision_param=bfloat16"), "train") != base
    assert refkey.key(_run(data), "validation") != base

    run = _run(data)
    run.checkpoint.enable, run.checkpoint.initial_load_path = True, str(_checkpoint(tmp_path / "a"))
    from_a = refkey.key(run, "train")
    assert from_a != base  # a checkpoint, not the random init
    run.checkpoint.initial_load_path = str(_checkpoint(tmp_path / "b", b"\x01" * 64))
    assert refkey.key(run, "train") != from_a  # other weights
    run.objective.dpo.reference_path = str(tmp_path / "a")  # the reference: a's weights again
    assert refkey.key(run, "train") == from_a


def test_the_key_ignores_seq_len_packing_and_seed_unless_truncating(tmp_path):
    data, weights = _dataset(tmp_path / "data"), _checkpoint(tmp_path / "ckpt")

    def key(*overrides: str) -> str:
        run = _run(data, *overrides)
        run.checkpoint.enable, run.checkpoint.initial_load_path = True, str(weights)
        return refkey.key(run, "train")

    base = key()
    for override in ("training.seq_len=512", "data.packing=false", "debug.seed=7"):
        assert key(override) == base, override
    cut = key("data.overflow=truncate")
    assert cut != base  # a cut side has other token ids
    assert key("data.overflow=truncate", "training.seq_len=512") != cut
    # a random init (smoke runs) is its seed's weights
    assert refkey.key(_run(data, "debug.seed=7"), "train") != refkey.key(_run(data), "train")


def test_the_table_lives_in_a_hidden_folder_the_records_never_come_from(tmp_path, monkeypatch):
    from qwen3_trainium.data.preference import source

    data = _dataset(tmp_path / "data")
    run = _run(data)
    before = (refkey.key(run, "train"), len(source.records(run)))
    path = refkey.table_path(run, "train")
    assert os.path.dirname(path) == str(data / ".ref_logps")
    os.makedirs(os.path.dirname(path))
    # a record file in the table's folder: were it read, the records (and the key) would change
    shutil.copy(data / "pairs.jsonl", os.path.join(os.path.dirname(path), "pairs.jsonl"))
    source._load.cache_clear()
    assert (refkey.key(run, "train"), len(source.records(run))) == before

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(refkey.os, "access", lambda p, mode: False)  # a read-only dataset
    assert refkey.table_dir(run) == str(tmp_path / "cache" / "qwen3-trainium" / "ref_logps")


def _table(n: int, seed: int = 0) -> ref.ReferenceTable:
    g = torch.Generator().manual_seed(seed)
    present = torch.rand(n, generator=g) > 0.2
    return ref.ReferenceTable(
        -100 * torch.rand(n, generator=g), -100 * torch.rand(n, generator=g), present, 64
    )


def test_lookup_gives_chosen_at_even_rejected_at_odd_slots_and_zero_for_no_pair():
    table = _table(11)
    g = torch.Generator().manual_seed(1)
    pairs = torch.randint(0, 11, (3, 5), generator=g)
    pairs[0, 3:] = -1
    pairs[2, :] = -1
    got = table.lookup(pairs)
    assert got.shape == (3, 10) and got.dtype == torch.float32
    for b in range(3):
        for j in range(5):
            i = int(pairs[b, j])
            want = (0.0, 0.0) if i < 0 else (float(table.chosen[i]), float(table.rejected[i]))
            assert got[b, 2 * j].item() == pytest.approx(want[0], rel=1e-7)
            assert got[b, 2 * j + 1].item() == pytest.approx(want[1], rel=1e-7)


def test_lookup_runs_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    table = _table(5)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        got = table.lookup(mode.from_tensor(torch.tensor([[0, 4, -1]])))
    assert got.shape == (1, 6)
    assert table.lookup(torch.tensor([[4]]))[0, 1].item() == pytest.approx(float(table.rejected[4]), rel=1e-7)


def test_a_table_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = str(tmp_path / ".ref_logps" / "k.safetensors")
    old = _table(7, seed=0)
    old.save(path)
    back = ref.ReferenceTable.load(path)
    assert torch.equal(back.chosen, old.chosen) and torch.equal(back.present, old.present)
    assert back.seq_len == 64 and os.listdir(tmp_path / ".ref_logps") == ["k.safetensors"]

    def interrupted(src, dst):  # the writer dies between writing and renaming
        raise OSError("killed")

    monkeypatch.setattr(ref.os, "replace", interrupted)
    with pytest.raises(OSError):
        _table(7, seed=1).save(path)
    assert torch.equal(ref.ReferenceTable.load(path).chosen, old.chosen)  # the old table, whole


def test_a_table_covers_a_run_that_keeps_no_more_pairs():
    table = _table(9)  # some records unscored (too long at seq_len 64 with overflow=drop)
    assert not table.present.all()
    assert table.covers(64) and table.covers(32) and not table.covers(128)
    table.present[:] = True
    assert table.covers(128)


class _Trainer:
    """What ``prepare`` reads of a torchtitan trainer before any pre-pass."""

    def __init__(self, config_path: str, step: int, seq_len: int):
        from types import SimpleNamespace

        self.step = step
        self.config = SimpleNamespace(
            dpo=SimpleNamespace(config_path=config_path), training=SimpleNamespace(seq_len=seq_len)
        )


def _saved(run, folder) -> str:
    from qwen3_trainium.parent import compose

    return compose.save(run, str(folder))


def test_a_resume_without_its_table_is_refused_with_the_path_and_the_fix(tmp_path):
    run = _run(_dataset(tmp_path / "data"))
    trainer = _Trainer(_saved(run, tmp_path / "run"), step=5, seq_len=run.training.seq_len)
    with pytest.raises(ref.ReferenceMissing) as e:
        ref.prepare(trainer, "train")
    path = refkey.table_path(run, "train")
    assert path in str(e.value) and "step 5" in str(e.value) and "Fix:" in str(e.value)

    table = _table(6)  # computed at seq_len 64, with unscored records: not enough at 256
    table.save(path)
    with pytest.raises(ref.ReferenceMissing) as e:
        ref.prepare(trainer, "train")
    assert path in str(e.value) and "training.seq_len=64 (or shorter)" in str(e.value)
    table.present[:] = True  # every record scored: the same resume goes on
    table.save(path)
    assert torch.equal(ref.prepare(trainer, "train").chosen, table.chosen)


def _completion_sum(tok, record: dict, side: str) -> float:
    """The Transformers oracle: TRL 1.16.0's completion of ``side`` (the full render's ids past
    their common prefix with the generation prompt's, ``DPOTrainer._prepare_dataset``), summed."""
    prompt = tok.apply_chat_template(record["prompt"], add_generation_prompt=True, tokenize=True)["input_ids"]
    full = tok.apply_chat_template(record["prompt"] + record[side], tokenize=True)["input_ids"]
    k = next((i for i, (a, b) in enumerate(zip(prompt, full, strict=False)) if a != b), len(prompt))
    return float(sum(full[k:]))


class _PrePassTrainer(_Trainer):
    """A trainer whose "log-prob" of a completion token is its id: a side's sum is the sum of
    its completion's ids, which the oracle above computes from the records alone."""

    def __init__(self, config_path: str, run, step: int = 0):
        from types import SimpleNamespace

        super().__init__(config_path, step, run.training.seq_len)
        self.config.dpo.reference_path = ""
        self.config.training.local_batch_size = run.training.local_batch_size
        self.model_parts = [torch.nn.Linear(1, 1)]
        self.parallel_dims = SimpleNamespace(dp_enabled=False)
        self.calls = 0

    def dpo_side_sums(self, input_dict, labels):
        from qwen3_trainium.data.preference import PAIR_KEY, SEGMENT_KEY

        assert not self.model_parts[0].training and not torch.is_grad_enabled()
        self.calls += 1
        segment = input_dict[SEGMENT_KEY]
        out = torch.zeros(segment.shape[0], 2 * input_dict[PAIR_KEY].shape[1])
        for b, t in zip(*torch.nonzero(segment >= 0, as_tuple=True), strict=True):
            out[b, segment[b, t]] += float(labels[b, t])
        return out


def test_the_pre_pass_scores_every_pair_once_and_a_second_start_reuses_it(tmp_path, caplog):
    from transformers import AutoTokenizer

    data = _dataset(tmp_path / "data", n=12, first="A very long answer. " * 40)  # record 0: too long
    run = _run(data, "training.seq_len=128", "training.local_batch_size=2")
    trainer = _PrePassTrainer(_saved(run, tmp_path / "run"), run)
    table = ref.prepare(trainer, "train")
    assert trainer.model_parts[0].training  # the mode it had
    assert trainer.calls >= 2  # several batches of packed rows
    tok = AutoTokenizer.from_pretrained(run.data.hf_assets_path)
    records = [json.loads(line) for line in (data / "pairs.jsonl").read_text().splitlines()]
    assert table.present.tolist() == [False] + [True] * 11  # dropped: longer than seq_len
    for i in range(1, 12):
        assert table.chosen[i].item() == _completion_sum(tok, records[i], "chosen"), i
        assert table.rejected[i].item() == _completion_sum(tok, records[i], "rejected"), i
    path = refkey.table_path(run, "train")
    assert torch.equal(ref.ReferenceTable.load(path).rejected, table.rejected)

    again = _PrePassTrainer(trainer.config.dpo.config_path, run)
    with caplog.at_level("INFO"):
        reused = ref.prepare(again, "train")
    assert again.calls == 0 and f"reference log-probs: reused {path}" in caplog.text
    assert torch.equal(reused.chosen, table.chosen)


def _rank(rank: int, port: int, folder: str, out: dict) -> None:
    """One of two gloo ranks: the pre-pass over 7 pairs (4 rows and 3: one rank pads once)
    and over 1 pair (the other rank has no row at all)."""
    import pathlib
    from types import SimpleNamespace

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = SimpleNamespace(get_local_rank=lambda: rank, size=lambda: 2)
    for name, n in (("seven", 7), ("one", 1)):
        run = _run(
            _dataset(pathlib.Path(folder) / name, n=n), "training.seq_len=96", "training.local_batch_size=1"
        )
        trainer = _PrePassTrainer(os.path.join(folder, f"{name}.yaml"), run)
        trainer.parallel_dims = SimpleNamespace(dp_enabled=True, get_mesh=lambda _: mesh)
        table = ref.prepare(trainer, "train")
        out[(name, rank)] = (trainer.calls, table.chosen.tolist(), table.present.tolist())
    dist.barrier()  # neither rank tears its group down while the other may still use it
    dist.destroy_process_group()


@pytest.mark.heavy  # two spawned processes importing torch: ~20 s on 2 cores
def test_two_ranks_run_as_many_forwards_and_both_hold_the_whole_table(tmp_path):
    import socket

    import torch.multiprocessing as mp
    from transformers import AutoTokenizer

    for name, n in (("seven", 7), ("one", 1)):
        run = _run(_dataset(tmp_path / name, n=n), "training.seq_len=96", "training.local_batch_size=1")
        os.replace(_saved(run, tmp_path / f"{name}-run"), tmp_path / f"{name}.yaml")  # the ranks' config
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_rank, args=(port, str(tmp_path), out), nprocs=2, start_method="spawn")
        out = dict(out)
    tok = AutoTokenizer.from_pretrained(run.data.hf_assets_path)
    for name, n, forwards in (("seven", 7, 4), ("one", 1, 1)):
        records = [json.loads(line) for line in (tmp_path / name / "pairs.jsonl").read_text().splitlines()]
        want = [_completion_sum(tok, r, "chosen") for r in records]
        assert out[(name, 0)] == out[(name, 1)] == (forwards, want, [True] * n), name


def test_the_key_follows_the_pre_pass_version_and_a_random_inits_makers(tmp_path, monkeypatch):
    """A table written by another version of the pre-pass (or, for a random init, by other torch
    or torchtitan init code) is never read: it would hold other numbers under the same name (seen:
    a table left by an earlier pre-pass gave step-1 rewards of -0.656 instead of 0)."""
    data = _dataset(tmp_path / "data")
    base = refkey.key(_run(data), "train")
    monkeypatch.setattr(refkey, "PREPASS", refkey.PREPASS + " (changed)")
    assert refkey.key(_run(data), "train") != base
    monkeypatch.undo()
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "0.0" if name == "torchtitan" else real(name)
    )
    assert refkey.key(_run(data), "train") != base
