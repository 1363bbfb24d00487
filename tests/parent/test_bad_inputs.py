"""The bad-input table: for every field of the schema at least one bad value (a wrong type,
out of range, empty, a path that does not exist, a choice that does not exist), plus keys the
schema lacks, data faults and knobs of another device. Each case must exit 1 or 2, print no
traceback, start nothing and name its key.

It runs in-process (compose with Hydra, then the launcher's own job, launching, with process
start-up replaced by a tripwire): a refusal by Hydra is what ``launch.py`` prints and exits 1
with; a refusal by pre-flight exits 2. Composing is most of the cost, so each set of group
choices is composed once and a case's value overrides are applied to a copy by Hydra's own
``_apply_overrides_to_config``, the step ``compose`` ends with (a test checks both agree). Cases that only torchtitan-level checks can catch run as
dry runs (at launch those overlap rank start-up, and the ranks stop at the gate: test_overlap.py).
A few cases also run as real ``python launch.py`` processes, to show what the user sees.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import types
import typing
from enum import Enum
from pathlib import Path
from unittest import mock

import pytest
from conftest import CONF, ROOT, compose_cfg, run_launch
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent import launcher
from qwen3_trainium.parent.preflight.ranges import RANGES

BASE = ("smoke=on", "tracking=off", "device=cpu")
HYDRA_ERRORS = (HydraException, OmegaConfBaseException)


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str
    overrides: tuple[str, ...]
    key: str  # named in the message
    deep: bool = False  # caught by the torchtitan-level checks: run as a dry run

    @property
    def id(self) -> str:
        return f"{self.kind}:{' '.join(self.overrides)}"


def leaf_fields(schema: type = RunConf, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, type) of every leaf field of the schema."""
    out = []
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(f.type):
            out += leaf_fields(f.type, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", f.type))
    return out


def _wrong_type(annotation) -> str:
    """A value of the wrong type for a field of this type (Hydra refuses it when composing)."""
    if isinstance(annotation, types.UnionType):  # X | None
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    origin = typing.get_origin(annotation)
    if origin is list:
        (item,) = typing.get_args(annotation)
        return "[nope]" if isinstance(item, type) and issubclass(item, Enum | float | int) else "{a:1}"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "nope"
    if annotation is bool:
        return "maybe"
    if annotation in (int, float):
        return "abc"
    if annotation is str:
        return "[1,2]"
    if annotation is dict:
        return "[1,2]"
    raise AssertionError(f"no wrong-type value for {annotation}")


def generated_cases() -> list[Case]:
    return [Case("type", (f"{key}={_wrong_type(t)}",), key) for key, t in leaf_fields()]


# One value out of range per ranged key (those ranges.py checks), on BASE (10 steps, 1 process).
OUT_OF_RANGE = {
    "launcher.rdzv_endpoint": ["localhost:http", "localhost:70000"],  # torchrun reads no such port
    "training.steps": ["0", "-5"],
    "training.seq_len": ["0"],
    "training.local_batch_size": ["0"],
    "training.global_batch_size": ["0", "-2"],
    "training.max_norm": ["0", "-1.0"],
    "training.gc_freq": ["0"],
    "optimizer.lr": ["-1", "0"],
    "optimizer.betas": ["[0.9,1.0]", "[0.9]", "[-0.1,0.95]"],
    "optimizer.eps": ["0", "-1e-8"],
    "optimizer.weight_decay": ["-0.1"],
    "lr_scheduler.warmup_steps": ["11", "-1"],
    "lr_scheduler.decay_ratio": ["1.5", "-0.5"],
    "lr_scheduler.min_lr_factor": ["2.0", "-1.0"],
    "parallel.data_parallel_replicate_degree": ["0"],
    "parallel.data_parallel_shard_degree": ["0", "-2"],
    "parallel.tensor_parallel_degree": ["0"],
    "parallel.pipeline_parallel_degree": ["0"],
    "parallel.pipeline_parallel_microbatch_size": ["0"],
    "parallel.context_parallel_degree": ["-1"],
    "parallel.expert_parallel_degree": ["0"],
    "parallel.auto_top": ["0"],
    "parallel.auto_traces": ["0"],
    "parallel.auto_budget": ["-5"],
    "launcher.nnodes": ["0"],
    "launcher.nproc_per_node": ["0", "-3"],
    "launcher.rdzv_port": ["0", "70000"],
    "launcher.node_rank": ["1", "-2"],
    "launcher.log_rank": ["1", "-1"],
    "checkpoint.interval": ["0"],
    "checkpoint.keep_latest_k": ["-1"],
    "checkpoint.load_step": ["-2"],
    "tracking.log_freq": ["0"],
    "tracking.expert_idle_warn_steps": ["-1"],
    "debug.seed": ["-1"],
    "model.moe_block_size": ["0"],
    "eval.freq": ["0"],
    "eval.steps": ["0", "-3"],
    "eval.sample_tokens": ["-1"],
    "eval.sample_prompts": ["['']"],
    "data.validation_fraction": ["0", "0.9"],
    "data.preview": ["-1"],
    "memory.timeout": ["0"],
    "peft.rank": ["0"],
    "peft.alpha": ["0", "-16"],
}

# objective=dpo's values (parent/preflight/dpo.py), each on objective=dpo.
DPO_BAD = {
    "objective.dpo.beta": ["0", "-0.1"],
    "objective.dpo.loss_type": ["[]", "[ipo,ipo]"],
    "objective.dpo.loss_weights": ["[1.0,2.0]", "[-1.0]"],
    "objective.dpo.label_smoothing": ["0.1", "-0.5"],  # sigmoid ignores it in TRL 1.16.0
    "objective.dpo.discopop_tau": ["0"],
    "objective.dpo.reference": ["adapters_off"],  # without peft=lora
    "objective.dpo.reference_path": ["/nonexistent/reference"],
    "parallel.pipeline_parallel_degree": ["2"],
}


def explicit_cases(data: dict[str, Path]) -> list[Case]:
    cases = [Case("range", (f"{key}={v}",), key) for key, values in OUT_OF_RANGE.items() for v in values]
    cases += [
        Case("dpo", ("objective=dpo", f"{key}={v}"), key) for key, values in DPO_BAD.items() for v in values
    ]
    cases += [
        # out of range against the instance: 64 logical cores at LNC=2, 128 at LNC=1
        Case("range", ("device=neuron", "launcher.nproc_per_node=65"), "launcher.nproc_per_node"),
        Case("range", ("device=neuron", "device.lnc=1", "launcher.nproc_per_node=129"), "launcher.nproc_per_node"),
        Case("range", ("checkpoint.hf_max_shard_size=0",), "checkpoint.hf_max_shard_size"),
        Case("range", ("model=nki_moe", "model.moe_block_size=100"), "model.moe_block_size"),
        Case("range", ("model=nki_moe", "training.seq_len=200"), "training.seq_len"),  # rope_hf: 128 x LNC
        Case("range", ("eval=on", "parallel=cpu2", "eval.steps=-1"), "eval.steps"),  # -1 hangs ranks that disagree
        Case("range", ("eval=on", "eval.sample_tokens=300"), "eval.sample_tokens"),  # past seq_len
        Case("range", ("eval=on", "parallel.pipeline_parallel_degree=2", "launcher.nproc_per_node=2"), "eval.sample_tokens"),
        Case("range", ("checkpoint=hf_export", "training.seq_len=128"), "training.seq_len"),  # the 256-token probe
        # empty
        Case("empty", ("data.dataset_path=",), "data.dataset_path"),
        Case("empty", ("data.dataset=",), "data.dataset"),
        Case("empty", ("data.hf_assets_path=",), "data.hf_assets_path"),
        Case("empty", ("checkpoint=resume", "checkpoint.folder="), "checkpoint.folder"),
        Case("empty", ("checkpoint.hf_max_shard_size=",), "checkpoint.hf_max_shard_size"),
        Case("empty", ("tracking=wandb", "tracking.project="), "tracking.project"),
        Case("empty", ("device=neuron", "device.instance="), "device.instance"),
        Case("empty", ("device=neuron", "device.compile_cache="), "device.compile_cache"),
        Case("empty", ("launcher.rdzv_endpoint=",), "launcher.rdzv_endpoint"),
        Case("empty", ("launcher.rdzv_id=",), "launcher.rdzv_id"),
        Case("empty", ("model.flavor=",), "model.flavor", deep=True),
        Case("empty", ("compile=on", "compile.components=[]"), "compile.components"),
        Case("empty", ("model=hf", "model.hf_model="), "model.hf_model"),
        Case("empty", ("data=local",), "data.dataset_path"),  # required, never set
        Case("empty", ("eval=on", "data.validation_path="), "data.validation_path"),
        # a path that does not exist
        Case("path", ("data=local", "data.dataset_path=/nonexistent/corpus"), "data.dataset_path"),
        Case("path", ("data.hf_assets_path=/nonexistent/tokenizer",), "data.hf_assets_path"),
        Case("path", ("checkpoint.initial_load_path=/nonexistent/ckpt",), "checkpoint.initial_load_path"),
        Case("path", ("model=hf", "model.hf_model=/nonexistent/model"), "model.hf_model"),
        Case("path", ("checkpoint=hf_finetune", f"checkpoint.initial_load_path={data['empty']}"), "checkpoint.initial_load_path"),
        Case("path", ("override.imports=[no_such_package.factory]",), "override.imports"),
        Case("path", ("override.imports=[nodots]",), "override.imports"),
        Case("path", ("eval=on", "data.validation_path=/nonexistent/heldout"), "data.validation_path"),
        Case("path", ("eval=on", f"data.validation_path={data['no_data']}"), "data.validation_path"),
        # a choice that does not exist
        Case("choice", ("model.flavor=nope",), "model.flavor", deep=True),
        Case("choice", ("data.dataset=nope",), "data.dataset", deep=True),
        Case("choice", ("model=nki_moe", "model.kernels=[nope]"), "model.kernels"),
        Case("choice", ("model.kernels=[rope_hf]",), "model.kernels"),  # kernels come with model=nki_moe
        Case("choice", ("model=nki_moe", "model.flavor=tiny"), "model.flavor"),
        Case("choice", ("model.attn_backend=flex",), "model.attn_backend"),
        Case("choice", ("model.attn_backend=varlen",), "model.attn_backend"),
        Case("choice", ("compile.backend=neuron",), "compile.backend"),
        Case("choice", ("device=neuron", "compile.backend=inductor"), "compile.backend"),
        Case("choice", ("compile.enable_async_tensor_parallel=true",), "compile.enable_async_tensor_parallel"),
        Case("choice", ("device=neuron", "device.instance=trn9.48xlarge"), "device.instance"),
        Case("choice", ("device.lnc=3",), "device.lnc"),
        Case("choice", ("lr_scheduler.decay_type=cosinee",), "lr_scheduler.decay_type"),
        Case("choice", ("parallel.fsdp_reshard_after_forward=sometimes",), "parallel.fsdp_reshard_after_forward"),
        Case("choice", ("checkpoint.export_dtype=float8",), "checkpoint.export_dtype"),
        Case("choice", ("tracking.wandb_mode=onlin",), "tracking.wandb_mode"),
        Case("choice", ("optimizer.name=SGD",), "optimizer.name"),
        Case("choice", ("optimizer.implementation=forloop",), "optimizer.implementation"),
        Case("choice", ("parallel.pipeline_parallel_schedule=1f1b",), "parallel.pipeline_parallel_schedule"),
        Case("choice", ("checkpoint.async_mode=sometimes",), "checkpoint.async_mode"),
        Case("choice", ("launcher.rdzv_backend=zmq",), "launcher.rdzv_backend"),
        Case("choice", ("model=nope",), "model"),
        Case("choice", ("parallel=nope",), "parallel"),
        Case("choice", ("checkpoint.hf_max_shard_size=lots",), "checkpoint.hf_max_shard_size"),
        Case("choice", ("parallel.data_parallel_shard_degree=3",), "parallel"),  # 3 x ... != 1 rank
        Case("choice", ("launcher.nnodes=2", "launcher.rdzv_endpoint=localhost:0"), "launcher.rdzv_endpoint"),
        # keys the schema does not have
        Case("key", ("+training.stepz=3",), "training.stepz"),
        Case("key", ("+optimizer.betaz=[0.9,0.9]",), "optimizer.betaz"),
        Case("key", ("+model.flavour=tiny",), "model.flavour"),
        Case("key", ("+foo=1",), "foo"),
        Case("key", ("training.stepz=3",), "training.stepz"),  # without +: Hydra's own refusal
        # objective=dpo: the data, the objective and the paths come together
        Case("dpo", ("objective=dpo", "data=chat"), "data.format"),
        Case("dpo", ("data=preference",), "objective"),
        Case("dpo", ("objective=dpo", "model=hf"), "model"),
        Case("dpo", ("objective.dpo.beta=0.5",), "objective.dpo.beta"),  # objective=sft reads no dpo key
        # data faults
        Case("data", ("data=local", f"data.dataset_path={data['empty']}"), "data.dataset_path"),
        Case("data", ("data=local", f"data.dataset_path={data['binary']}"), "data.dataset_path"),
        Case("data", ("data=local", f"data.dataset_path={data['no_text']}"), "data.dataset_path"),
        Case("data", ("data=local", f"data.dataset_path={data['no_data']}"), "data.dataset_path"),
        Case("data", ("data=local", f"data.dataset_path={data['blank']}"), "data.dataset_path"),
        Case("data", ("data=local", f"data.dataset_path={data['not_json']}"), "data.dataset_path"),
        Case("data", ("data=local", f"data.dataset_path={data['file']}/train.jsonl"), "data.dataset_path"),
        Case("data", (f"data.hf_assets_path={data['no_tokenizer']}",), "data.hf_assets_path"),
        # eval=on: held-out records that cannot hold one validation (1 record: none held out)
        Case("data", ("eval=on", "data=local", f"data.dataset_path={data['file']}"), "data.dataset_path", deep=True),
        Case("data", ("eval=on", f"data.validation_path={data['file']}", "eval.steps=4"), "data.validation_path", deep=True),
    ]  # fmt: skip
    return cases


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-data")
    files = {
        "empty": {},
        "binary": {"train.jsonl": b"\x00\x01\x02\xff" * 64},
        "no_text": {"train.jsonl": b'{"content": "a record without the text field"}\n'},
        "no_data": {"README.md": b"# notes, no data\n"},
        "blank": {"a.txt": b"", "b.jsonl": b'{"text": "   "}\n'},
        "not_json": {"train.jsonl": b"this line is not JSON\n"},
        "file": {"train.jsonl": b'{"text": "a fine record"}\n'},
        "no_tokenizer": {"tokenizer_config.json": b"{}"},
    }
    dirs = {}
    for name, content in files.items():
        d = root / name
        d.mkdir()
        for fname, data in content.items():
            (d / fname).write_bytes(data)
        dirs[name] = d
    return dirs


def all_cases(data: dict[str, Path]) -> list[Case]:
    return generated_cases() + explicit_cases(data)


def _base_for(overrides: tuple[str, ...]) -> list[str]:
    groups = {o.lstrip("+").split("=", 1)[0].split(".", 1)[0] for o in overrides}
    return [b for b in BASE if b.split("=", 1)[0] not in groups]


class _Started(Exception):
    pass


GROUPS = {p.name for p in CONF.iterdir() if p.is_dir()}
_COMPOSED: dict[tuple[str, ...], object] = {}


def compose(overrides: list[str]):
    """``compose_cfg(*overrides)``, composing each set of group choices once."""
    groups = tuple(o for o in overrides if o.split("=", 1)[0] in GROUPS)
    values = [o for o in overrides if o not in groups]
    if groups not in _COMPOSED:
        _COMPOSED[groups] = compose_cfg(*groups)
    cfg = copy.deepcopy(_COMPOSED[groups])
    ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides(values), cfg)
    return cfg


def outcome(case: Case, run_dir: Path) -> tuple[int, str, bool]:
    """(exit code, what the user reads, whether a process was started) of one case."""
    overrides = [*_base_for(case.overrides), *case.overrides, *(["dry_run=true"] if case.deep else [])]
    try:
        cfg = compose(overrides)
    except HYDRA_ERRORS as err:  # launch.py: Hydra prints the message (and its cause), exit 1
        return 1, f"{err}\n{err.__cause__ or ''}", False
    job = launcher.Job(run_dir=str(run_dir), launch_dir=str(ROOT), run_name="bad-input")
    out = io.StringIO()
    with (
        mock.patch.object(launcher, "start", side_effect=_Started),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(out),
    ):
        try:
            _status, code = launcher._run_job(cfg, job)
        except _Started:
            return 0, out.getvalue(), True
    return code, out.getvalue(), False


def test_the_table_covers_every_field_and_has_100_cases(data_dirs):
    cases = all_cases(data_dirs)
    assert len(cases) >= 100
    assert len({c.id for c in cases}) == len(cases)
    keys = {key for key, _ in leaf_fields()}
    assert keys <= {c.key for c in cases}  # every field has at least one bad value
    assert {r.key for r in RANGES} <= set(OUT_OF_RANGE)  # every range is exercised


def test_composing_once_per_group_choice_is_composing(data_dirs):
    for overrides in (
        ["smoke=on", "device=neuron", "launcher.nproc_per_node=65", "+training.stepz=3"],
        ["model=nki_moe", "data=local", f"data.dataset_path={data_dirs['file']}", "optimizer.lr=-1"],
    ):
        assert compose(overrides) == compose_cfg(*overrides)
    for bad in (["training.steps=abc"], ["lr_scheduler.decay_type=cosinee"], ["+training.steps=3"]):
        ours, hydras = _error(compose, bad), _error(lambda o: compose_cfg(*o), bad)
        assert ours is not None and ours == hydras


def _error(compose_fn, overrides: list[str]) -> str | None:
    try:
        compose_fn(overrides)
    except HYDRA_ERRORS as err:
        return f"{type(err).__name__}: {err} / {err.__cause__}"
    return None


def test_every_bad_input_is_refused_cleanly_naming_its_key(data_dirs, tmp_path):
    """All cases in one test (one torchtitan import, about a minute); failures listed together."""
    failures, kinds = [], {}
    for case in all_cases(data_dirs):
        kinds[case.kind] = kinds.get(case.kind, 0) + 1
        try:
            code, text, started = outcome(case, tmp_path / "run")
        except Exception as err:  # a traceback for the user
            failures.append(f"{case.id}: raised {type(err).__name__}: {err}")
            continue
        wrong = []
        if code not in (1, 2):
            wrong.append(f"exit {code}")
        if started:
            wrong.append("a process was started")
        if "Traceback" in text:
            wrong.append("a traceback")
        if case.key not in text:
            wrong.append(f"{case.key} not named")
        if wrong:
            failures.append(f"{case.id}: {', '.join(wrong)}\n    {text.strip()[:400]}")
        assert not (tmp_path / "run" / "checkpoint").exists()
    print("bad-input cases by kind:", kinds, "total", sum(kinds.values()))
    assert not failures, f"{len(failures)} case(s) not refused cleanly:\n" + "\n".join(failures)


@pytest.mark.parametrize(
    ("args", "key", "code"),
    [
        (("+training.stepz=3",), "training.stepz", 2),
        (("optimizer.lr=-1",), "optimizer.lr", 2),
        (("device=neuron", "launcher.nproc_per_node=65", "dry_run=true"), "launcher.nproc_per_node", 2),
        (("lr_scheduler.decay_type=cosinee",), "lr_scheduler.decay_type", 1),
        (("training.steps=abc",), "training.steps", 1),
    ],
)
def test_what_the_user_sees(args, key, code, tmp_path):
    """The issue's three, and two that Hydra refuses, as real processes: the exit code, the key,
    no traceback, no run directory content (nothing started)."""
    run_dir = tmp_path / "run"
    proc = run_launch("smoke=on", "tracking=off", *args, f"hydra.run.dir={run_dir}", timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode == code, text[-2000:]
    assert key in text and "Traceback" not in text
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "logs").exists()
