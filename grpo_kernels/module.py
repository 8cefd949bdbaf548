"""FusedLinearGRPOLoss: the constructor and forward of Liger Kernel's LigerFusedLinearGRPOLoss.

Swapping `from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss` for
`from grpo_kernels import FusedLinearGRPOLoss as LigerFusedLinearGRPOLoss` is the whole migration.
Liger's performance knobs (`compiled`, `chunk_size`) are accepted and ignored: the kernels stream
over the vocabulary whatever they say.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import warnings
from typing import Iterable, Optional

import torch

from .api import fused_linear_grpo_loss_named, linear_logprobs_named
from .argument_names import ArgumentNames
from .backends import check_backend_name
from .backends.sharded_head import check_process_group
from .config import GRPOLossConfig, LossConfigWarning, check_setting
from .losses import get_loss_type, loss_param_aliases
from .keywords import closest_name, keywords_checked, refuse_unknown_keywords
from .messages import shown
from .scalars import integer_value
from .torchscript import refuse_scripting, refuse_symbolic_trace
from .validation import (check_config, check_kept_token_ids, check_linear_inputs, check_loss_inputs,
                         check_optional_tensors, check_targets, check_workspace, ids_where_scored,
                         trainer_advantages)


# Liger's constructor, kept at this boundary: its leading parameters in its order, its names (epsilon_low for
# GRPOLossConfig's epsilon; TRL's names of sapo's / vespo's hyper-parameters) and its defaults where they differ
# from TRL's. Every other loss setting follows from GRPOLossConfig's declarations (liger_signature).
LIGER_ORDER = ("beta", "compiled", "use_ref_model", "chunk_size", "epsilon_low", "epsilon_high", "loss_type",
               "max_completion_length", "importance_sampling_level", "sapo_temperature_pos", "sapo_temperature_neg",
               "temperature")
LIGER_NAMES = {"epsilon_low": "epsilon"}  # Liger's name -> GRPOLossConfig's
LIGER_DEFAULTS = {"beta": 0.04, "epsilon_high": 0.2, "max_completion_length": None, "use_bias_correction_kl": False}
# forward()'s names for the loss's inputs, which its refusals use (Liger's, not fused_linear_grpo_loss's)
FORWARD_NAMES = ArgumentNames(hidden="_input", weight="lin_weight", targets="selected_token_ids",
                              mask="attention_mask", old_logps="old_per_token_logps",
                              ref_logps="ref_per_token_logps", importance_ratio="vllm_is_ratio")
# ...and for the reference model's log-probs computed from ref_input (with lin_weight when no ref_weight is given)
REFERENCE_NAMES = ArgumentNames(hidden="ref_input", weight="ref_weight", bias="ref_bias",
                                targets="selected_token_ids", mask="attention_mask")
REFERENCE_WITH_POLICY_HEAD = dataclasses.replace(REFERENCE_NAMES, weight="lin_weight")
# Liger's performance knobs and reference switch (not loss settings), then this module's own options.
MODULE_OPTIONS = {"compiled": True, "use_ref_model": True, "chunk_size": 1, "backend": "auto",
                  "workspace_bytes": None, "process_group": None}


def liger_signature(config_class: type = GRPOLossConfig) -> inspect.Signature:
    """The constructor's parameters: Liger's in its order, then every other setting `config_class` declares and
    every loss-type hyper-parameter TRL names (aliases), `loss_params`, and this module's options."""
    settings = {f.name: f.default for f in dataclasses.fields(config_class) if "setting" in f.metadata}
    aliases = {alias: get_loss_type(owner).params[param].default
               for alias, (owner, param) in loss_param_aliases().items()}
    liger_to_ours = {name: LIGER_NAMES.get(name, name) for name in LIGER_ORDER}
    names = list(LIGER_ORDER) + [name for name in [*settings, *aliases]
                                 if name not in liger_to_ours.values() and name not in LIGER_ORDER]

    def default(name: str) -> object:
        if name in MODULE_OPTIONS:
            return MODULE_OPTIONS[name]
        ours = liger_to_ours.get(name, name)
        return LIGER_DEFAULTS.get(ours, settings.get(ours, aliases.get(ours)))

    parameters = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default(name))
                  for name in names]
    parameters += [inspect.Parameter("loss_params", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)]
    parameters += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=value)
                   for name, value in MODULE_OPTIONS.items() if name not in LIGER_ORDER]
    return inspect.Signature(parameters)


def liger_config(config_class: type, signature: inspect.Signature, *args: object, **kwargs: object
                 ) -> tuple[GRPOLossConfig, dict[str, object]]:
    """(the loss config, the module's options) of a constructor call by Liger's names."""
    refuse_unknown_keywords("FusedLinearGRPOLoss", signature.parameters, kwargs)
    bound = signature.bind(*args, **kwargs)
    given = set(bound.arguments)
    bound.apply_defaults()
    # a loss type's hyper-parameter by TRL's name only when given: its default is the declaration's, in loss_params
    values = {name: value for name, value in bound.arguments.items()
              if name in given or name not in loss_param_aliases()}
    options = {name: values.pop(name) for name in MODULE_OPTIONS}
    _check_options(options)
    loss_params = values.pop("loss_params")
    for liger_name, ours in LIGER_NAMES.items():  # refused by Liger's name, the one the caller wrote
        check_setting(ours, values[liger_name], shown_as=liger_name, config_class=config_class)
    config = config_class(**{LIGER_NAMES.get(name, name): value for name, value in values.items()},
                          loss_params={} if loss_params is None else loss_params)
    return config, options


def _check_options(options: dict[str, object]) -> None:
    """Liger's switches and knobs and this module's options, before anything is built from them."""
    for name in ("compiled", "use_ref_model"):
        if not isinstance(options[name], bool):
            raise TypeError(f"{name} must be True or False, got {shown(options[name])}")
    chunk_size = integer_value(options["chunk_size"])
    if chunk_size is None or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int (Liger's; this module streams by its own), got "
                         f"{shown(options['chunk_size'])}")
    check_backend_name(options["backend"])
    if options["workspace_bytes"] is not None:
        check_workspace(options["workspace_bytes"])
    check_process_group(options["process_group"])  # a string or a mesh was taken, and refused at the first forward


class FusedLinearGRPOLoss(torch.nn.Module):
    _signature = liger_signature()

    def __init__(self, *args: object, **kwargs: object):
        """Liger's LigerFusedLinearGRPOLoss constructor (its names, order and defaults; the loss settings as
        GRPOLossConfig declares them). `loss_params`: a loss type's own hyper-parameters by their declared names.
        `process_group`: the group over which `lin_weight` (and `bias`) hold vocabulary shards, when they are
        this rank's rows of the head (a DTensor head sharded on dim 0 needs none)."""
        super().__init__()
        config, options = liger_config(GRPOLossConfig, self._signature, *args, **kwargs)
        # held here, read and written through the attributes below (the GEMM path's workspace_bytes None: 1 GiB)
        self.__dict__.update(_config=config, _options=options)

    # ---- the constructor's arguments as attributes -----------------------------------------------------------
    # Liger's module keeps each constructor argument as an attribute that forward reads (self.beta, ...): code
    # written for it reads and sets them (a KL coefficient annealed between steps). Here each is read from the
    # config and the options, and set through the constructor's own checks, the config rebuilt; before, setting
    # one was silently ignored (a plain attribute no forward read) and reading one failed.

    def __setattr__(self, name: str, value: object) -> None:
        # A new attribute named like a setting (a typo, `loss_fn.bta = 0.0`, or GRPOLossConfig's name of one the
        # module calls otherwise, `loss_fn.epsilon` for epsilon_low) was a plain attribute no forward reads: the
        # loss kept the old value without a word. Any other new attribute is the caller's own, set as usual.
        if not name.startswith("_") and not hasattr(self, name):
            meant = _meant_setting(name, self._signature.parameters)
            if meant is not None:
                raise AttributeError(f"{type(self).__name__} has no setting {name!r:.60}, so setting it would change "
                                     f"nothing the loss reads; did you mean {meant!r}?")
        super().__setattr__(name, value)

    @property
    def config(self) -> GRPOLossConfig:
        return self._config

    @config.setter
    def config(self, config: GRPOLossConfig) -> None:
        if not isinstance(config, GRPOLossConfig):  # forward reads its settings: anything else failed inside it
            raise TypeError(f"config must be a GRPOLossConfig, got {type(config).__name__}")
        self.__dict__["_config"] = check_config(config)

    # A process group is this process's handle on a communicator: a deep copy of the module (a frozen reference
    # model holding it) shares it, and pickling refuses it by name. Before, both failed as "cannot pickle
    # 'torch._C._distributed_c10d.ProcessGroup' object"; dropping it would have made a loaded module take its shard
    # for the whole vocabulary, without an error.
    def __prepare_scriptable__(self) -> "FusedLinearGRPOLoss":
        refuse_scripting(type(self).__name__)  # torch.jit.script(module) asks this first

    def __deepcopy__(self, memo: dict) -> "FusedLinearGRPOLoss":
        group = self._options["process_group"]
        if group is not None:
            memo[id(group)] = group
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__setstate__(copy.deepcopy(super().__getstate__(), memo))
        return copied

    def __getstate__(self) -> dict:
        if self._options["process_group"] is not None:
            raise TypeError("FusedLinearGRPOLoss with a process_group cannot be pickled (torch.save): a process "
                            "group is this process's communicator. Set process_group = None before saving, and set "
                            "it again after loading")
        return super().__getstate__()

    def __setstate__(self, state: dict) -> None:
        if "_config" not in state and "config" in state:  # pickled (torch.save) when these were plain attributes
            state = dict(state)
            options = {name: state.pop(name, default) for name, default in MODULE_OPTIONS.items()}
            state.update(_config=state.pop("config"), _options=options)
        super().__setstate__(state)

    def _argument(self, name: str) -> object:
        if name in MODULE_OPTIONS:
            return self._options[name]
        return getattr(self._config, LIGER_NAMES.get(name, name))  # a setting, loss_params or a TRL alias

    def _set_argument(self, name: str, value: object) -> None:
        config_class = type(self._config)
        arguments = {**_constructor_arguments(self._config), **self._options}
        if name == "loss_type":  # the new type's own hyper-parameters start from their declared defaults
            arguments["loss_params"] = {}
        owner, param = loss_param_aliases().get(name, (None, None))
        if owner == self._config.loss_type:  # the alias replaces the value loss_params holds
            arguments["loss_params"].pop(param, None)
        arguments[name] = value
        signature = self._signature if config_class is GRPOLossConfig else liger_signature(config_class)
        with warnings.catch_warnings():
            if name not in ("loss_type", "importance_sampling_level"):  # what the combination warned of is unchanged
                warnings.simplefilter("ignore", LossConfigWarning)
            config, options = liger_config(config_class, signature, **arguments)
            # a subclass's own fields that are not settings (no constructor argument sets them) are kept
            kept = {f.name: getattr(self._config, f.name) for f in dataclasses.fields(config_class)
                    if "setting" not in f.metadata and f.name != "loss_params"}
            config = dataclasses.replace(config, **kept) if kept else config
        self.__dict__.update(_config=config, _options=options)

    @keywords_checked
    def forward(
        self,
        _input: torch.Tensor,
        lin_weight: torch.Tensor,
        selected_token_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        advantages: torch.Tensor,
        bias: Optional[torch.Tensor] = None,
        ref_per_token_logps: Optional[torch.Tensor] = None,
        old_per_token_logps: Optional[torch.Tensor] = None,
        ref_input: Optional[torch.Tensor] = None,
        ref_weight: Optional[torch.Tensor] = None,
        ref_bias: Optional[torch.Tensor] = None,
        vllm_is_ratio: Optional[torch.Tensor] = None,
        num_items_in_batch: Optional[torch.Tensor] = None,
        kept_token_ids: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Returns (loss, [kl if beta != 0, clip_ratio]) as Liger does.

        Liger's semantics: with `use_ref_model=False` there is no reference, whatever is passed, and the KL term
        (and its metric) is 0; `ref_per_token_logps` wins over `ref_input` (with Liger's warning when both are
        given); `vllm_is_ratio` may be [B] (one ratio per sequence, as [B, 1]), [B, 1] or [B, T].
        `kept_token_ids` [B, T, K]: the sampler's kept-token sets (see `fused_linear_grpo_loss`); reference log-probs
        computed here use them too.
        """
        refuse_symbolic_trace("FusedLinearGRPOLoss", (_input, lin_weight, selected_token_ids, attention_mask,
                                                       advantages, ref_per_token_logps))  # before the checks below
        # the reference's inputs, which Liger's semantics may leave unread (use_ref_model=False, beta=0, or
        # ref_per_token_logps beside ref_input): of the kind they must be all the same, before any work
        check_optional_tensors(ref_per_token_logps=ref_per_token_logps, ref_input=ref_input, ref_weight=ref_weight,
                               ref_bias=ref_bias)
        if not isinstance(selected_token_ids, torch.Tensor) or selected_token_ids.dim() != 2:
            raise ValueError(f"selected_token_ids must be a [B, T] tensor, got {shown(selected_token_ids)}")
        B, T = selected_token_ids.shape
        selected_token_ids = ids_where_scored(selected_token_ids, attention_mask)  # padding's ids (-100): never read
        # Liger documents _input as [B*T, H]; TRL passes [B, T, H]. Accept both.
        hidden = _as_batch_grid("_input", _input, B, T)
        importance_ratio = _per_sequence_or_token_ratio(vllm_is_ratio, B, T)
        advantages = trainer_advantages(advantages, selected_token_ids)  # [B, 1], integers: as Liger takes them
        if self._computes_reference(ref_per_token_logps, ref_input):
            # the reference pass is a whole head's work: the policy's inputs are checked before it, not after
            self._check_policy_inputs(hidden, lin_weight, bias, selected_token_ids, attention_mask, advantages,
                                      old_per_token_logps, importance_ratio, num_items_in_batch, kept_token_ids)
        ref_logps = self._reference_logps(B, T, lin_weight, selected_token_ids, attention_mask,
                                          ref_per_token_logps, ref_input, ref_weight, ref_bias, kept_token_ids)
        # No reference: Liger's KL is taken against the policy's own detached log-probs, 0 in value and gradient
        # (bias-corrected or not), which is the loss without the KL term.
        config = self.config if ref_logps is not None or self.config.beta == 0.0 else _without_kl(self.config)
        out = fused_linear_grpo_loss_named(
            FORWARD_NAMES, hidden, lin_weight, selected_token_ids, attention_mask, advantages, bias=bias,
            old_logps=old_per_token_logps, ref_logps=ref_logps, importance_ratio=importance_ratio,
            num_items_in_batch=num_items_in_batch, config=config, backend=self.backend,
            workspace_bytes=self.workspace_bytes, process_group=self.process_group, kept_token_ids=kept_token_ids)
        metrics = []
        if self.config.beta != 0.0:
            metrics.append(out.metrics["kl"] if ref_logps is not None else torch.zeros((), device=out.loss.device))
        if get_loss_type(self.config.loss_type).clip is None:
            # Liger reports no clipping for objectives that do not clip (soft-gated, gamma-weighted): a 0
            metrics.append(torch.zeros((), device=out.loss.device))
        else:
            metrics.append(out.metrics["clip_ratio/region_mean"])
        return out.loss, metrics

    def _computes_reference(self, ref_per_token_logps: Optional[torch.Tensor], ref_input: Optional[torch.Tensor]
                            ) -> bool:
        """Whether forward computes the reference log-probs from ref_input (Liger's precedence)."""
        return (self.use_ref_model and self.config.beta != 0.0 and ref_per_token_logps is None
                and ref_input is not None)

    def _check_policy_inputs(self, hidden, lin_weight, bias, selected_token_ids, attention_mask, advantages,
                             old_per_token_logps, importance_ratio, num_items_in_batch, kept_token_ids) -> None:
        """The checks the loss runs on the policy's inputs (by forward's names), without the reference log-probs
        that do not exist yet."""
        values = not torch.compiler.is_compiling()
        check_linear_inputs(hidden, lin_weight, bias, check_finite=values, names=FORWARD_NAMES)
        if hidden.dim() != 3:
            raise ValueError(f"_input must be [B*T, H] or [B, T, H], got shape {list(hidden.shape)}")
        B, T = selected_token_ids.shape
        check_targets("selected_token_ids", selected_token_ids, (B, T), lin_weight.shape[0], hidden.device, values,
                      anchor="_input")
        check_loss_inputs((B, T), hidden.device, attention_mask, advantages, old_per_token_logps, None,
                          importance_ratio, num_items_in_batch, _without_kl(self.config), values, FORWARD_NAMES)
        check_kept_token_ids(kept_token_ids, selected_token_ids, lin_weight.shape[0], attention_mask, values,
                             "selected_token_ids")

    def _reference_logps(self, B: int, T: int, lin_weight: torch.Tensor, selected_token_ids: torch.Tensor,
                         attention_mask: torch.Tensor, ref_per_token_logps: Optional[torch.Tensor],
                         ref_input: Optional[torch.Tensor], ref_weight: Optional[torch.Tensor],
                         ref_bias: Optional[torch.Tensor], kept_token_ids: Optional[torch.Tensor] = None
                         ) -> Optional[torch.Tensor]:
        """The reference log-probs the KL term uses (over the kept-token sets when given), or None when there is no
        KL term."""
        if not self.use_ref_model:
            return None
        if ref_per_token_logps is not None and ref_input is not None:
            warnings.warn(REF_INPUT_IGNORED_WARNING, stacklevel=3)
        if self.config.beta == 0.0:
            return None
        if ref_per_token_logps is not None:
            return ref_per_token_logps
        if ref_input is None:
            raise ValueError("use_ref_model=True with beta != 0 needs ref_per_token_logps or ref_input (with "
                             "ref_weight); pass use_ref_model=False for no KL term")
        names = REFERENCE_NAMES if ref_weight is not None else REFERENCE_WITH_POLICY_HEAD
        with torch.no_grad():
            return linear_logprobs_named(
                names, _as_batch_grid("ref_input", ref_input, B, T),
                ref_weight if ref_weight is not None else lin_weight,
                selected_token_ids, bias=ref_bias, temperature=self.config.temperature, backend=self.backend,
                mask=attention_mask, workspace_bytes=self.workspace_bytes, process_group=self.process_group,
                kept_token_ids=kept_token_ids)


def _constructor_arguments(config: GRPOLossConfig) -> dict[str, object]:
    """The constructor's loss arguments (Liger's names) that build `config` again."""
    liger_name = {ours: liger for liger, ours in LIGER_NAMES.items()}
    arguments = {liger_name.get(f.name, f.name): getattr(config, f.name) for f in dataclasses.fields(config)
                 if "setting" in f.metadata}
    return {**arguments, "loss_params": dict(config.loss_params)}


def _meant_setting(name: str, settings: Iterable[str]) -> Optional[str]:
    """The module's setting `name` stands for: GRPOLossConfig's name of one (epsilon: epsilon_low), or the
    setting it is a typo of (closer than keyword typos need: an attribute of the caller's own may be near one)."""
    liger_name = {ours: liger for liger, ours in LIGER_NAMES.items()}
    if name in liger_name:
        return liger_name[name]
    return closest_name(name, settings, cutoff=0.8)


def _argument_attribute(name: str) -> property:
    return property(lambda self: self._argument(name), lambda self, value: self._set_argument(name, value),
                    doc=f"The constructor's {name!r}: read from the module's config and options, set through its "
                        f"checks")


for _name in FusedLinearGRPOLoss._signature.parameters:
    setattr(FusedLinearGRPOLoss, _name, _argument_attribute(_name))


def _without_kl(config: GRPOLossConfig) -> GRPOLossConfig:
    with warnings.catch_warnings():  # the same options again: GRPOLossConfig has already warned about them
        warnings.simplefilter("ignore")
        return dataclasses.replace(config, beta=0.0)


# Liger's own text (fused_linear_ppo.py), so code that filters it keeps working.
REF_INPUT_IGNORED_WARNING = "Both ref_per_token_logps and ref_input are provided. Using ref_per_token_logps."


def _as_batch_grid(name: str, x: object, B: int, T: int) -> object:
    """A [B*T, H] input as [B, T, H]; any other value as it is, for the loss's checks to name. A row count other
    than B*T is refused here (its reshape failed inside torch), and reshape, not view, takes any strides."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        return x
    if x.shape[0] != B * T:
        raise ValueError(f"{name} must be [B*T, H]=[{B * T}, H] or [B, T, H]=[{B}, {T}, H] (B, T from "
                         f"selected_token_ids), got {list(x.shape)}")
    return x.reshape(B, T, x.shape[1])


def _per_sequence_or_token_ratio(vllm_is_ratio: Optional[torch.Tensor], B: int, T: int) -> Optional[torch.Tensor]:
    """Liger's vllm_is_ratio shapes: [B] is one ratio per sequence, i.e. [B, 1]."""
    if vllm_is_ratio is None:
        return None
    if not isinstance(vllm_is_ratio, torch.Tensor):
        raise TypeError(f"vllm_is_ratio must be a torch.Tensor, got {type(vllm_is_ratio).__name__}")
    shape = tuple(vllm_is_ratio.shape)
    if shape == (B,):
        return vllm_is_ratio.unsqueeze(-1)
    if shape in ((B, 1), (B, T)):
        return vllm_is_ratio
    raise ValueError(f"vllm_is_ratio must have shape [B]=[{B}], [B, 1]=[{B}, 1] or [B, T]=[{B}, {T}], "
                     f"got {list(shape)}")


FusedLinearGRPOLoss.__init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
     *FusedLinearGRPOLoss._signature.parameters.values()])
