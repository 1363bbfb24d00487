"""Run config -> torchtitan ``Trainer.Config``: the only place that builds one.

``to_trainer_config`` is pure (same run config, same ``Trainer.Config``). ``trainer_config``
is the zero-argument function torchtitan's entry point calls in every rank
(``--module qwen3_trainium.rank.titan --config trainer_config``): it reads the run directory's
``resolved.yaml`` and translates it.
"""

from __future__ import annotations

import dataclasses
import os
from enum import Enum

from qwen3_trainium.config import cpu_device, devices, flavors, runconfig
from qwen3_trainium.config.schema import PARALLEL_AUTO_FIELDS, ACMode, AttnBackend, ModelPath, RunConf
from qwen3_trainium.rank import dpo_config, titan_eval
from qwen3_trainium.shared.contract import METRICS_NAME, PROBE_NAME, RUN_DIR_ENV

SDPA_OVERRIDE = "qwen3_trainium.models.overrides.attention.document_sdpa"
CAUSAL_OVERRIDE = "qwen3_trainium.models.overrides.attention.causal_sdpa"
EXPERTS_OVERRIDE = "qwen3_trainium.models.overrides.experts.param_dtype_experts"


def fields(section, drop=()) -> dict:
    """A schema section as torchtitan's keyword arguments: closed choices (Enums) as their strings
    (``drop``: our own fields, which torchtitan's config does not have)."""
    items = dataclasses.asdict(section).items()
    return {k: v.value if isinstance(v, Enum) else v for k, v in items if k not in drop}


def titan_attn_backend(run: RunConf) -> str:
    """The backend torchtitan builds; sdpa and causal are built as varlen and swapped by an override."""
    backend = run.model.attn_backend
    return "varlen" if backend in (AttnBackend.sdpa, AttnBackend.causal) else backend.value


def override_imports(run: RunConf) -> list:
    """torchtitan ``override.imports``: attention, kernels, then the user's own entries."""
    from qwen3_trainium.models.kernels import KERNEL_OVERRIDES

    imports: list = []
    if run.model.path is not ModelPath.hf and run.model.attn_backend is AttnBackend.sdpa:
        imports.append(SDPA_OVERRIDE)
    if run.model.path is not ModelPath.hf and run.model.attn_backend is AttnBackend.causal:
        imports.append(CAUSAL_OVERRIDE)
    float32_cpu = run.device.type.value == "cpu" and run.training.mixed_precision_param.value == "float32"
    moe = run.model.path is not ModelPath.hf and run.model.flavor in flavors.MOE_FLAVORS
    if moe and float32_cpu and "moe_experts" not in run.model.kernels:
        imports.append(EXPERTS_OVERRIDE)
    for kernel in run.model.kernels:
        target = KERNEL_OVERRIDES[kernel]
        if kernel == "moe_experts":
            options = {
                "block_size": run.model.moe_block_size,
                "compute_dtype": run.model.moe_compute_dtype.value,
            }
            imports.append((target, options))
        else:
            imports.append(target)
    return imports + list(run.override.imports)


def _optimizer(run: RunConf):
    from torchtitan.components.optimizer import OptimizersContainer, ParamGroupConfig

    opt = run.optimizer
    kwargs = {"lr": opt.lr, "betas": tuple(opt.betas), "eps": opt.eps, "weight_decay": opt.weight_decay}
    group = ParamGroupConfig(pattern=r".*", optimizer_name=opt.name.value, optimizer_kwargs=kwargs)
    return OptimizersContainer.Config(param_groups=[group], implementation=opt.implementation.value)


def _activation_checkpoint(mode: ACMode):
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    return {ACMode.none: None, ACMode.selective: SelectiveAC.Config(), ACMode.full: FullAC.Config()}[mode]


def _training(run: RunConf):
    from torchtitan.config import TrainingConfig

    # CUDA graphs are a CUDA feature; elsewhere torchtitan would only warn and run eager. The
    # MoE balance losses pool each forward in Python and read their value on the host
    # (models/moe_balance.py): no CPU<->GPU synchronisation is allowed in a captured step.
    balance = moe_balance(run)
    graphs = run.device.type.value == "cuda" and not (balance.aux_loss_coef or balance.z_loss_coef)
    return TrainingConfig(**fields(run.training), disable_cuda_graphs=not graphs)


def _metrics(run: RunConf, run_dir: str):
    from qwen3_trainium.rank.metrics import JsonlMetricsProcessor

    track = run.tracking
    info = devices.device_info(
        run.device.type.value,
        lnc=run.device.lnc,
        instance=run.device.instance,
        nproc=run.launcher.nproc_per_node,
    )
    return JsonlMetricsProcessor.Config(
        log_freq=track.log_freq,
        enable_wandb=False,  # ours (below): the resolved config, a stable id, the sweep as group
        enable_tensorboard=track.tensorboard,
        wandb_run_dir=run_dir if track.wandb else "",
        disable_color_printing=True,
        jsonl_path=os.path.join(run_dir, METRICS_NAME),
        # torchtitan's peak-FLOPS table falls back to A100 figures off-GPU: MFU is meaningless on CPU.
        report_mfu=run.device.type.value != "cpu",
        memory_capacity_gib=(info.memory_per_rank or 0) / 2**30,
        peak_flops_per_rank=info.peak_flops_per_rank or 0.0,
    )


OWN_CHECKPOINT_FIELDS = ("allow_partial_load", "export_check")  # used in the parent only


def run_rope(run: RunConf):
    """The run's RoPE (``config/rope.py``): model.rope_scaling against the checkpoint and flavor."""
    from qwen3_trainium.config import rope

    return rope.of_run(run, flavors.rope_table(run.model.flavor))


def _hf_config_json(run: RunConf, spec, source_dir: str | None) -> str:
    """config.json for an HF export: the source model's own with the run's RoPE written in
    (``models/hf_rope.py``), else one made from the flavor."""
    rope = run_rope(run)
    if source_dir and os.path.isfile(os.path.join(source_dir, "config.json")):
        from qwen3_trainium.models.hf_rope import config_json

        with open(os.path.join(source_dir, "config.json")) as f:
            return config_json(f.read(), rope)
    from qwen3_trainium.rank.checkpoint import hf_config_json

    return hf_config_json(spec.model, rope)


def _checkpoint(run: RunConf, spec, run_dir: str):
    """torchtitan's checkpoint fields (our manager adds RNG state and complete HF exports);
    model=hf adds the initial load of hf_model's weights."""
    from qwen3_trainium.rank.checkpoint import Qwen3CheckpointManager

    kwargs = {k: v for k, v in fields(run.checkpoint).items() if k not in OWN_CHECKPOINT_FIELDS}
    hf_init = run.model.path is ModelPath.hf and run.model.load_weights and not kwargs["initial_load_path"]
    if hf_init:
        kwargs.update(
            initial_load_path=run.model.hf_model, initial_load_in_hf=True, initial_load_model_only=True
        )
        if not kwargs["enable"]:  # load the weights, save nothing
            kwargs.update(enable=True, load_only=True)
    if kwargs["last_save_in_hf"]:
        if run.model.path is ModelPath.hf:
            source = run.model.hf_model
        else:
            source = kwargs["initial_load_path"] if kwargs["initial_load_in_hf"] else None
        kwargs.update(
            hf_config_json=_hf_config_json(run, spec, source),
            tokenizer_dir=run.data.hf_assets_path,
            source_dir=source or "",
            chat_template=titan_eval.chat_template(run, text=True) if run.data.chat_template else "",
        )
        if run.checkpoint.export_check:
            kwargs["probe_path"] = os.path.join(run_dir, PROBE_NAME)
        if run.peft.method.value == "lora":
            kwargs["lora"] = {**fields(run.peft), "base": source or ""}
    return Qwen3CheckpointManager.Config(**kwargs)


def moe_balance(run: RunConf):
    """The balance losses' coefficients (``rank/moe_balance.py``); 0 without a native MoE."""
    from qwen3_trainium.rank.moe_balance import balance_config

    return balance_config(run, run.model.path is not ModelPath.hf and run.model.flavor in flavors.MOE_FLAVORS)


def _balance(run: RunConf, model_config) -> None:
    """``model.moe_balance`` on the model (``rank/moe_balance.py``): torchtitan's aux-loss-free
    expert bias (``MoE.Config.load_balance_coeff``, on in its Qwen3-MoE flavors) stays only for
    ``bias``; Qwen3-MoE in HF format has no router bias, so an HF copy would route differently
    (pre-flight refuses bias with HF weights). The routers record the aux/z-loss sums when a
    coefficient is on."""
    from qwen3_trainium.models.moe_balance import use_balanced_routers
    from qwen3_trainium.rank.moe_balance import Mode, mode

    if mode(run, run.model.flavor in flavors.MOE_FLAVORS) is not Mode.bias:
        for layer in model_config.layers:
            if getattr(layer, "moe", None) is not None:
                layer.moe.load_balance_coeff = None
    balance = moe_balance(run)
    if balance.aux_loss_coef or balance.z_loss_coef:
        use_balanced_routers(model_config)


def _model_parts(run: RunConf) -> tuple[type, dict]:
    """The Trainer.Config class and the model-specific fields (spec, loss, hf_model). The
    trainers are torchtitan's, stopping at a step boundary on SIGTERM (``trainer.py``)."""
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss

    from qwen3_trainium.rank import trainer

    if run.model.path is ModelPath.hf:
        from qwen3_trainium.models import hf

        spec = hf.model_spec(run.model.hf_model, run.model.attn_backend, run_rope(run))
        parts = {"model_spec": spec, "loss": CrossEntropyLoss.Config(), "hf_model": run.model.hf_model}
        config_cls = trainer.trainer_class(hf=True).Config
    else:
        from torchtitan.models.common.config_utils import decoder_vocab_size

        from qwen3_trainium.config import flavors
        from qwen3_trainium.models import yarn

        spec = flavors.model_spec(run.model.flavor, titan_attn_backend(run))
        yarn.apply(spec.model, run_rope(run))
        _balance(run, spec.model)
        if "moe_experts" in run.model.kernels:  # experts stored fused: converted at the HF boundary
            from qwen3_trainium.models.overrides.blockwise_experts import FusedExpertsStateDictAdapter

            spec.state_dict_adapter = FusedExpertsStateDictAdapter
        if dpo_config.settings(run).enable:  # per-token weights from the DPO step (rank/dpo.py)
            from qwen3_trainium.rank.dpo_loss import DPOTokenLoss

            inner = DPOTokenLoss.Config()
        else:
            inner = CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(spec))
        parts = {"model_spec": spec, "loss": ChunkedLossWrapper.Config(loss_fn=inner)}
        config_cls = trainer.trainer_class(hf=False).Config
    if run.peft.method.value == "lora":  # native, nki_moe (pre-flight refuses model=hf)
        from qwen3_trainium.models import lora

        lora.apply(spec, rank=run.peft.rank, alpha=run.peft.alpha, targets=list(run.peft.target_modules))
    if run.device.type.value == "cpu":
        spec.parallelize_fn = cpu_device.gloo_safe_parallelize(spec.parallelize_fn)
    return config_cls, parts


def to_trainer_config(run: RunConf, run_dir: str):
    """The torchtitan ``Trainer.Config`` for a resolved run config. Pure (with eval=on it also
    registers the held-out loaders in torchtitan's dataset registry, the same every time)."""
    from torchtitan.components.optimizer import LRSchedulersContainer
    from torchtitan.config import CompileConfig, DebugConfig, OverrideConfig, ParallelismConfig

    from qwen3_trainium.rank import expert_load

    config_cls, model_parts = _model_parts(run)
    dataloader, evaluation = titan_eval.evaluation(run, run_dir)
    return config_cls(
        **model_parts,
        moe_balance=moe_balance(run),
        expert_load=expert_load.config(run),
        dpo=dpo_config.settings(run, runconfig.rank_config_path(run_dir)),
        **evaluation,
        hf_assets_path=run.data.hf_assets_path,
        dump_folder=run_dir,
        dataloader=dataloader,
        optimizer=_optimizer(run),
        lr_scheduler=LRSchedulersContainer.Config(**fields(run.lr_scheduler)),
        training=_training(run),
        parallelism=ParallelismConfig(**fields(run.parallel, drop=PARALLEL_AUTO_FIELDS)),
        activation_checkpoint=_activation_checkpoint(run.activation_checkpoint.mode),
        checkpoint=_checkpoint(run, model_parts["model_spec"], run_dir),
        metrics=_metrics(run, run_dir),
        debug=DebugConfig(seed=run.debug.seed, deterministic=run.debug.deterministic),
        compile=CompileConfig(
            enable=run.compile.enable,
            components=[c.value for c in run.compile.components],
            backend=run.compile.backend.value,
            enable_async_tensor_parallel=bool(run.compile.enable_async_tensor_parallel),
        ),
        override=OverrideConfig(imports=override_imports(run)),
    )


def trainer_config():
    """Zero-argument config function for ``torchtitan.train --module/--config`` (rank side).
    torchtitan calls it before it builds anything: the rank waits here for pre-flight's verdict."""
    from qwen3_trainium.shared import gate

    gate.hold_rank()
    run_dir = os.environ[RUN_DIR_ENV]
    run = runconfig.load(runconfig.rank_config_path(run_dir))
    return to_trainer_config(run, run_dir)
