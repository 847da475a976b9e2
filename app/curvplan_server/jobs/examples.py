"""Examples of the main job operations in the OpenAPI document.

The recommendation example is the planner's own answer for ``EXAMPLE_MEASUREMENTS`` with
default targets and seed 1 (a test recomputes it, so the example cannot drift from the code).
"""

from __future__ import annotations

from pydantic import JsonValue

EXAMPLE_MEASUREMENTS: dict[str, JsonValue] = {
    "gradient_noise": {
        "grad_sq_norm": 0.02,
        "trace_sigma": 3.1,
        "gHg": 0.004,
        "trace_h_sigma": 0.9,
    },
    "blocks": [{"name": "layers.0.q", "lambda_max": 2.0, "lambda_min": 0.0, "spectral_norm": 2.0}],
    "full_model": {"lambda_max": 2.5, "residual": 1e-07, "converged": True, "n_products": 31},
}
EXAMPLE_SEED = 1

RECOMMENDATION_EXAMPLE: dict[str, JsonValue] = {
    "budget": {
        "data": {
            "recommended_examples": None,
            "recommended_examples_ci": None,
            "recommended_tokens": None,
            "unit": "examples",
            "source": "not_available",
            "criterion": "nothing predictive to lead with: the evaluation-set size "
            "and k*(ε) are shown beside, but neither is a training-set "
            "size",
            "guarantee": "no training-set size",
            "target_loss": None,
            "target_status": None,
            "irreducible_loss": None,
            "irreducible_loss_ci": None,
            "tolerance": None,
            "evaluation_set_size": None,
            "landscape_stabilisation": None,
            "available_samples": None,
            "available_is_enough": None,
            "available_note": None,
            "measured_sizes": None,
            "next_step": {
                "command": "curvplan sweep --type data --spec model.json --train train.safetensors"
                " --eval eval.safetensors --batch-size 32 --wait",
                "data_sizes": None,
                "next_round_sizes": None,
                "training_runs": 18,
                "lr_grid_runs": 3,
                "batch_size": 32,
                "max_steps_per_run": 50000,
                "steps_rule": "steps = min(50,000, max(200, ceil(10 epochs × D / batch 32))): each "
                "size trains its own decayed schedule to the end",
                "max_examples_processed": 28800000,
                "max_tokens_processed": None,
                "estimated_seconds": None,
                "later_rounds": "if the first round does not bracket the target, later rounds "
                "halve below or double above it: at most 3 rounds and 36 runs in all (--max-"
                "rounds, --max-runs)",
                "estimated_cost": "18 training runs (one child job each: 6 sizes × 3 lr-grid "
                "multipliers) of steps = min(50,000, max(200, ceil(10 epochs × D / batch 32))): "
                "each size trains its own decayed schedule to the end; at most "
                "28,800,000 examples processed; time unknown (model size not given); if"
                " the first round does not bracket the target, later rounds halve below"
                " or double above it: at most 3 rounds and 36 runs in all (--max-"
                "rounds, --max-runs); then `curvplan analyze … --sweep <sweep job id>` "
                "puts its L(D) in budget.data",
            },
            "reason": "no data sweep (measurements.loss_vs_data not given): only "
            "training on subsets of the data predicts how much data "
            "reaches a loss; run the command in next_step",
        },
        "batch": {
            "recommended": None,
            "recommended_tokens": None,
            "critical": None,
            "critical_ci": None,
            "critical_tokens": None,
            "critical_tokens_ci": None,
            "unit": "examples",
            "tokens_per_example": None,
            "source": "not_available",
            "basis": "not available",
            "critical_formula": None,
            "critical_bracket": None,
            "warmup_schedule": [],
            "critical_method": None,
            "branch_estimates": [],
            "scaling_law": None,
            "target_loss": None,
            "expected_steps": None,
            "expected_steps_ci": None,
            "expected_steps_formula": None,
            "expected_examples": None,
            "reason": "only one checkpoint's noise scale was measured; its late "
            "value is not used as a constant for the whole run: give "
            "intermediate checkpoints or run a batch sweep",
        },
        "learning_rate": {
            "gd_sharpness_threshold": 0.8,
            "lambda_max_full": 2.5,
            "lambda_max_full_products": 31,
            "lambda_max_full_converged": True,
            "lambda_max_block": 2.0,
            "lambda_max_block_name": "layers.0.q",
            "block_threshold": 1.0,
            "meaning": "2/λ_max of the whole-model Hessian is the "
            "gradient-descent sharpness threshold: with a "
            "full-batch GD step size above it the loss stops "
            "decreasing monotonically and the sharpness λ_max "
            "adjusts itself to about 2/η (edge of stability, "
            "Cohen et al. 2021); training usually goes on. It is "
            "not a divergence limit, and not a limit for SGD "
            "(noisy steps) or Adam (preconditioned steps)",
            "label": "gradient-descent sharpness threshold 2/λ_max(full "
            "Hessian) (Cohen et al. 2021)",
            "reason": None,
        },
        "defaults": {
            "tolerances_given": False,
            "tolerance_ratio": 0.01,
            "mean_loss_at_w_star": None,
            "tolerances": [],
            "target_loss_given": False,
            "target_loss": None,
            "target_loss_rule": "without targets.target_loss the target is the "
            "mean loss at w* (the loss the analysed "
            "checkpoint reached): the budget then answers "
            "'how much data and which batch size to get back "
            "to this loss'",
        },
        "warnings": [],
    },
    "sample_size": {
        "status": "not_computed",
        "reason": "needs measurements.per_sample_losses (empirical k*) or "
        "loss_bound, hessian_norm_bound and targets.radius (Theorem 7 k*)",
    },
    "batch_size": {
        "status": "computed",
        "grad_sq_norm": {
            "value": 0.02,
            "ci": None,
            "se": None,
            "formula": "batch.grad_sq_direct: |G|² as measured",
            "dof": None,
        },
        "trace_sigma": {
            "value": 3.1,
            "ci": None,
            "se": None,
            "formula": "batch.trace_sigma_direct: tr Σ as measured",
            "dof": None,
        },
        "gHg": {
            "value": 0.004,
            "ci": None,
            "se": None,
            "formula": "batch.ghg_direct: GᵀHG as measured",
            "dof": None,
        },
        "trace_h_sigma": {
            "value": 0.9,
            "ci": None,
            "se": None,
            "formula": "batch.trace_h_sigma_direct: tr(HΣ) as measured",
            "dof": None,
        },
        "source": "direct",
        "b_simple": {
            "value": 155.0,
            "ci": None,
            "se": None,
            "formula": "batch.b_simple: B_simple = tr Σ/|G|²",
            "dof": None,
        },
        "b_noise": {
            "value": 225.0,
            "ci": None,
            "se": None,
            "formula": "batch.b_noise: B_noise = tr(HΣ)/GᵀHG",
            "dof": None,
        },
        "b_crit": {"status": "not_computed", "reason": "measurements.steps_to_target not given"},
        "lr_scaling": {
            "formula": "batch.lr_scaling: ε_opt(B) = ε_max/(1 + B_noise/B), ε_max = |G|²/GᵀHG",
            "b_noise": 225.0,
            "epsilon_max": 5.0,
            "factor_at_recommended": None,
            "epsilon_opt_at_recommended": None,
            "note": None,
        },
        "unit": "examples",
        "tokens_per_example": None,
        "b_simple_reliability": None,
        "b_noise_reliability": None,
        "trend": [],
        "trend_note": None,
        "missing": [],
    },
    "scaling": {"status": "not_computed", "reason": "measurements.loss_vs_data not given"},
    "curvature": {
        "status": "computed",
        "blocks": [
            {
                "name": "layers.0.q",
                "spectral_norm": 2.0,
                "lambda_max": 2.0,
                "lambda_min": 0.0,
                "share_of_total_norm": 1.0,
                "block_threshold": 1.0,
                "negative_curvature": False,
                "trace": None,
            }
        ],
        "top_blocks": ["layers.0.q"],
        "heterogeneity_ratio": 1.0,
        "heterogeneity_formula": "curvature.heterogeneity: max/min of the per-block "
        "spectral norms ‖H_B‖",
        "block_threshold_formula": "curvature.block_threshold: 2/λ_max(H_gg) per block: an "
        "upper bound on 2/λ_max(H)",
        "gradient_norm_at_w_star": None,
        "assumption1_ratio": None,
        "assumption1_formula": None,
        "assumption1_mean_gradient_ratio": None,
        "per_sample_gradient_rms": None,
        "missing": [],
    },
    "warnings": [],
    "seed": 1,
}

_JOB_ID = "0b6e3a0e-5d1c-4f4e-9a57-3f1f2a3c4d5e"

JOB_EXAMPLE: dict[str, JsonValue] = {
    "id": _JOB_ID,
    "kind": "plan",
    "queue": "cpu",
    "status": "succeeded",
    "name": "gpt-small",
    "tags": {"team": "nlp"},
    "progress": {"fraction": 1.0, "stage": "done", "message": "recommendation ready"},
    "attempt": 1,
    "max_attempts": 3,
    "cancel_requested": False,
    "result": {"recommendation": RECOMMENDATION_EXAMPLE},
    "error": None,
    "request": {"kind": "plan", "name": "gpt-small", "measurements": EXAMPLE_MEASUREMENTS},
    "created_at": "2026-11-30T12:00:00Z",
    "updated_at": "2026-11-30T12:00:02Z",
    "started_at": "2026-11-30T12:00:01Z",
    "finished_at": "2026-11-30T12:00:02Z",
    "links": {
        "self": f"/v1/jobs/{_JOB_ID}",
        "cancel": f"/v1/jobs/{_JOB_ID}/cancel",
        "recommendation": f"/v1/jobs/{_JOB_ID}/recommendation",
    },
}

CREATE_EXAMPLES: dict[str, dict[str, JsonValue]] = {
    "plan": {
        "summary": "Plan from measurements the client has",
        "value": {
            "kind": "plan",
            "name": "gpt-small",
            "tags": {"team": "nlp"},
            "measurements": EXAMPLE_MEASUREMENTS,
            "targets": {"tolerances": [0.01]},
        },
    },
    "replan": {
        "summary": "Re-plan a finished analyze job with other targets",
        "value": {
            "kind": "plan",
            "from_job": "5f0c7d2e-8a43-4a7c-9d0e-6b1f2c3d4e5f",
            "targets": {"tolerances": [0.005], "target_loss": 2.1},
        },
    },
    "analyze": {
        "summary": "Analyze a checkpoint on an evaluation sample (artifact ids from uploads)",
        "value": {
            "kind": "analyze",
            "name": "gpt-small",
            "model": {
                "d_model": 64,
                "n_heads": 4,
                "d_ff": 256,
                "n_layers": 2,
                "task": {"type": "causal_lm", "vocab_size": 1000, "seq_len": 32},
            },
            "checkpoint": "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
            "dataset": "8b2c3d4e-5f6a-4b7c-9d8e-0f1a2b3c4d5e",
            "targets": {"tolerances": [0.01], "radius": 0.05},
        },
    },
}
