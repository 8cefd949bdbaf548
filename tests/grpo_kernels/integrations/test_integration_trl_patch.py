"""The switch itself: version pin, what gets patched, and clear errors."""

from __future__ import annotations

import pytest
import torch

trl = pytest.importorskip("trl")
from grpo_kernels.integrations.trl import (GRPOKernelsTrainer, check_trl_version,  # noqa: E402
                                           kernel_compute_loss, kernel_logps_and_entropies, patch_grpo_trainer)
from grpo_kernels.integrations.trl_loss import fused_path_blocker  # noqa: E402


def test_unsupported_trl_versions_fail_with_the_supported_range():
    check_trl_version("1.16.0")
    for version in ("1.15.2", "1.17.0", "0.29.1"):
        with pytest.raises(ImportError, match=r"supports trl.*1\.16.*pip install"):
            check_trl_version(version)


def test_patching_a_class_leaves_trl_untouched_and_keeps_the_originals():
    class MyTrainer(trl.GRPOTrainer):
        pass

    assert patch_grpo_trainer(MyTrainer, backend="torch") is MyTrainer
    assert MyTrainer._compute_loss is kernel_compute_loss
    assert MyTrainer._get_per_token_logps_and_entropies is kernel_logps_and_entropies
    assert trl.GRPOTrainer._compute_loss is not kernel_compute_loss
    assert MyTrainer._grpo_kernels_original_methods["_compute_loss"] is trl.GRPOTrainer._compute_loss
    patch_grpo_trainer(MyTrainer, backend="reference")  # again: only the backend changes
    assert MyTrainer._grpo_kernels_backend == "reference"
    assert MyTrainer._grpo_kernels_original_methods["_compute_loss"] is trl.GRPOTrainer._compute_loss


def test_patching_a_kernels_subclass_does_not_loop_back_to_itself():
    class Again(GRPOKernelsTrainer):
        pass

    patch_grpo_trainer(Again)
    assert Again._grpo_kernels_original_methods["_compute_loss"] is trl.GRPOTrainer._compute_loss


def test_bad_arguments_name_themselves():
    with pytest.raises(TypeError, match="trainer_or_class must be a trl.GRPOTrainer"):
        patch_grpo_trainer(torch.nn.Linear)
    with pytest.raises(ValueError, match="backend must be one of"):
        patch_grpo_trainer(GRPOKernelsTrainer, backend="gpu")
    with pytest.raises(ValueError, match="kernel_backend must be one of"):
        GRPOKernelsTrainer(model=None, kernel_backend="fast")


def test_multimodal_batches_keep_trl_path():
    class Stub:  # only what fused_path_blocker reads
        args, loss_type, top_entropy_quantile, aux_loss_enabled = None, "dapo", 1.0, False

    assert "multimodal" in fused_path_blocker(Stub(), {"pixel_values": torch.zeros(1)})


@pytest.mark.parametrize("how", ["patch_grpo_trainer", "GRPOKernelsTrainer"])
def test_a_head_the_fused_path_cannot_compute_is_refused_with_the_trainer_not_at_the_first_step(tmp_path, how):
    """A hook around lm_head (which the fused head would not run) was refused only at the first step, after the
    first generation; the trainer is refused when patched or built, naming the hook."""
    from integration_models import tiny_causal_lm, tiny_grpo_trainer

    model = tiny_causal_lm("qwen2")
    model.lm_head.register_forward_hook(lambda module, args, output: output * 0.5)
    with pytest.raises(TypeError, match=r"^the LM head Linear has a forward hook"):
        if how == "patch_grpo_trainer":
            patch_grpo_trainer(tiny_grpo_trainer(trl.GRPOTrainer, model, tmp_path), backend="torch")
        else:
            tiny_grpo_trainer(GRPOKernelsTrainer, model, tmp_path)
