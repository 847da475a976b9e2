"""A team's own training script, as `curvplan agent` runs it (plain torch, tiny, CPU, seconds).

Linear regression y = x·w* + ε on a fixed synthetic data set (16 features, σ = 0.5; the data
seed is fixed, so every point sees the same data), trained with AdamW or SGD. Every
``--eval-every`` steps it reports the held-out loss (½·MSE, floor σ²/2 = 0.125) with
:func:`curvplan.losslog.log_loss`, the agent protocol (docs/budget.md#the-loss-protocol):

    curvplan sweep --runner agent --type batch --target-loss 0.2 --batch-sizes 4,8,16,32 \\
        --lr 0.05 --base-batch-size 8 --max-steps 400 --eval-every 2 --name my-batch-sweep
    curvplan agent --default data_size=0 --command 'python examples/agent_trainer.py \\
        --batch-size {batch_size} --max-examples {data_size} --lr {lr} --max-steps {max_steps} \\
        --seed {seed} --out {output_dir} --eval-every {eval_every} --optimizer {optimizer}'

It stops at ``--target-loss`` when given (a batch sweep's ``{target_loss}``) and writes
``<out>/final.json`` when it finishes. ``--step-seconds`` sleeps after every step
(to watch a run, or to kill one mid-way in a test).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from curvplan.losslog import log_loss

FEATURES, NOISE, N_TRAIN, N_EVAL, DATA_SEED = 16, 0.5, 4096, 1024, 1234


def make_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(DATA_SEED)
    w_star = torch.randn(FEATURES, generator=gen)
    x = torch.randn(N_TRAIN + N_EVAL, FEATURES, generator=gen)
    y = x @ w_star + NOISE * torch.randn(N_TRAIN + N_EVAL, generator=gen)
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--max-examples", type=int, default=0, help="0: all the training data")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    parser.add_argument("--target-loss", type=float, default=None, help="stop once reached")
    parser.add_argument("--step-seconds", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    x_train, y_train, x_eval, y_eval = make_data()
    if args.max_examples:
        x_train, y_train = x_train[: args.max_examples], y_train[: args.max_examples]
    torch.manual_seed(args.seed)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = (
        torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        if args.optimizer == "adamw"
        else torch.optim.SGD(model.parameters(), lr=args.lr)
    )
    order = torch.Generator().manual_seed(args.seed)

    def eval_loss() -> float:
        with torch.no_grad():
            return 0.5 * float(((model(x_eval).squeeze(-1) - y_eval) ** 2).mean())

    log_loss(0, eval_loss(), examples=0)
    for step in range(1, args.max_steps + 1):
        idx = torch.randint(0, len(x_train), (args.batch_size,), generator=order)
        loss = 0.5 * ((model(x_train[idx]).squeeze(-1) - y_train[idx]) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if args.step_seconds:
            time.sleep(args.step_seconds)
        if step % args.eval_every == 0 or step == args.max_steps:
            loss_now = eval_loss()
            log_loss(step, loss_now, examples=step * args.batch_size)
            if args.target_loss is not None and loss_now <= args.target_loss:
                break
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "final.json").write_text(json.dumps({"steps": step}))


if __name__ == "__main__":
    main()
