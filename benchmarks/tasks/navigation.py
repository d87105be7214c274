"""Point-goal navigation with a DD-PPO-style learner: WAGMA's deep-RL workload, on MiniGrid.

WAGMA-SGD (arXiv:2005.00124 Section 5.4) trains DD-PPO (Wijmans et al., ICLR 2020, arXiv:1911.00357) on
Habitat point-goal navigation and reports SPL. Habitat and its scene datasets cannot be installed
here, so this task substitutes MiniGrid (``minigrid`` on PyPI, generated layouts, no download):
``MiniGrid-Empty-Random-6x6-v0``, a walled 6x6 room whose start cell and heading change with the
episode seed, small enough to learn on a CPU in a minute (``MiniGrid-SimpleCrossingS9N1-v0``, a room
split by a wall with one gap, did not pass SPL 0.4 in 60k experience steps: too slow for CI). What is kept from DD-PPO: a point-goal sensor (the goal's distance and
bearing in the agent's frame, Habitat's "GPS+compass"), the actions forward/left/right, the reward
``-(change in geodesic distance) + 2.5 on success - 0.01 per step``, two environments per worker,
PPO with clip 0.2, 2 PPO epochs of 2 mini-batches per rollout, value coefficient 0.5, entropy 0.01,
GAE with gamma 0.99 and lambda 0.95, Adam with lr 2.5e-4 and eps 1e-5 (habitat-lab ``ddppo_pointnav.yaml``), rollouts collected by
every worker with its own model and one synchronisation per mini-batch step, and SPL (Anderson et
al. 2018) as the metric. What differs: an egocentric 7x7 grid view instead of RGB-D, a small CNN
instead of ResNet-18 + 2-layer LSTM (the view plus the goal sensor make the task Markov), success
when the agent steps onto the goal (MiniGrid ends the episode there; Habitat needs a STOP action),
and no gradient clipping (DD-PPO clips the gradient norm at 0.2).

How it fits the runner: the training set is a pool of episode seeds that the sampler shards over
workers; ``make_loader`` returns a ``RolloutLoader`` that, each epoch, collects ``ROLLOUTS_PER_EPOCH``
rollouts with the current model and yields PPO mini-batches ``(x, y)``, with
``x = (view, goal)`` and ``y = (action, old log-prob, advantage, return)``; ``ppo_loss`` is the
task's loss. The validation set is a fixed list of seeds; ``evaluate`` plays one episode per seed.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, Sampler

from benchmarks.tasks import Task

ENV_ID = "MiniGrid-Empty-Random-6x6-v0"
NUM_ACTIONS = 3  # MiniGrid's left, right, forward (its indices 0, 1, 2); the others do nothing here
NUM_OBJECT_TYPES = 11  # MiniGrid's OBJECT_TO_IDX: unseen, empty, wall, ..., goal, lava, agent
NUM_ENVS = 2  # environments per worker, as WAGMA's runs
NUM_MINI_BATCH = 2
PPO_EPOCHS = 2
ROLLOUTS_PER_EPOCH = 8  # an epoch: 8 PPO updates, 8 x batch_size x NUM_MINI_BATCH experience steps
CLIP = 0.2
VALUE_COEF = 0.5
ENTROPY_COEF = 0.01
GAMMA = 0.99
GAE_LAMBDA = 0.95
SUCCESS_REWARD = 2.5
SLACK_REWARD = -0.01
TRAIN_SEEDS = 100_000  # pool of training layouts
VAL_SEED_OFFSET = 1_000_000  # validation layouts are never trained on
VAL_EPISODES = 64


class EpisodeSeeds(Dataset):
    """The integers ``offset .. offset + count - 1``, each one episode's layout seed."""

    def __init__(self, count: int, offset: int = 0) -> None:
        self.count, self.offset = count, offset

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.count:
            raise IndexError(index)
        return self.offset + index


def make_datasets(data_root: Path | None = None) -> tuple[EpisodeSeeds, EpisodeSeeds]:
    return EpisodeSeeds(TRAIN_SEEDS), EpisodeSeeds(VAL_EPISODES, VAL_SEED_OFFSET)


class NavigationPolicy(nn.Module):
    """Actor-critic: two 3x3 convolutions over the one-hot egocentric view, joined by the goal sensor.

    ``forward((view, goal))`` takes ``view`` (B, 7, 7, 3) uint8 MiniGrid encodings and ``goal``
    (B, 3) = (distance / grid size, cos bearing, sin bearing); it returns (logits (B, 3), value (B,)).
    """

    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(NUM_OBJECT_TYPES, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.Flatten()
        )
        self.body = nn.Sequential(nn.Linear(64 * 3 * 3 + 3, hidden), nn.ReLU())
        self.actor = nn.Linear(hidden, NUM_ACTIONS)
        self.critic = nn.Linear(hidden, 1)

    def forward(self, x: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        view, goal = x
        # Only the object type matters in these layouts (colours and door states do not vary).
        onehot = F.one_hot(view[..., 0].long(), NUM_OBJECT_TYPES).permute(0, 3, 1, 2).float()
        h = self.body(torch.cat([self.conv(onehot), goal.float()], dim=1))
        return self.actor(h), self.critic(h).squeeze(1)


def make_model() -> nn.Module:
    return NavigationPolicy()


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    last_value: torch.Tensor,
    gamma: float = GAMMA,
    lam: float = GAE_LAMBDA,
) -> torch.Tensor:
    """Generalised advantage estimates (Schulman et al. 2016) of a (T, N) rollout.

    ``dones[t]`` marks that the episode ended with step ``t``: the bootstrap from ``t + 1`` is cut.
    """
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(last_value)
    for t in reversed(range(len(rewards))):
        next_value = last_value if t == len(rewards) - 1 else values[t + 1]
        keep = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * keep - values[t]
        running = delta + gamma * lam * keep * running
        advantages[t] = running
    return advantages


def ppo_loss(out: tuple[torch.Tensor, torch.Tensor], y: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Clipped PPO surrogate + ``VALUE_COEF`` x value error - ``ENTROPY_COEF`` x entropy (a scalar)."""
    logits, value = out
    action, old_logp, advantage, ret = y
    dist_ = torch.distributions.Categorical(logits=logits)
    ratio = torch.exp(dist_.log_prob(action) - old_logp)
    surrogate = torch.min(ratio * advantage, ratio.clamp(1.0 - CLIP, 1.0 + CLIP) * advantage)
    value_loss = 0.5 * (ret - value).pow(2)
    return (-surrogate + VALUE_COEF * value_loss - ENTROPY_COEF * dist_.entropy()).mean()


def spl(success: bool, shortest: float, taken: float) -> float:
    """Success weighted by path length (Anderson et al. 2018): ``S * l / max(p, l)``."""
    if not success:
        return 0.0
    return shortest / max(taken, shortest) if shortest > 0 else 1.0


class NavEpisode:
    """One MiniGrid environment with the goal sensor, the geodesic distance and DD-PPO's reward."""

    def __init__(self) -> None:
        import gymnasium as gym
        import minigrid  # noqa: F401 - registers the MiniGrid environments with gymnasium

        self.env = gym.make(ENV_ID)
        self.view: np.ndarray | None = None

    def reset(self, seed: int) -> None:
        obs, _ = self.env.reset(seed=seed)
        grid = self.env.unwrapped
        self.size = max(grid.width, grid.height)
        self.goal = next(
            (i, j)
            for i in range(grid.width)
            for j in range(grid.height)
            if (c := grid.grid.get(i, j)) is not None and c.type == "goal"
        )
        self.distance = _geodesic(grid, self.goal)
        self.shortest = self.distance[tuple(grid.agent_pos)]
        self.cells_moved, self.view = 0, obs["image"]

    def observe(self) -> tuple[np.ndarray, np.ndarray]:
        grid = self.env.unwrapped
        dx, dy = self.goal[0] - grid.agent_pos[0], self.goal[1] - grid.agent_pos[1]
        heading = grid.dir_vec  # unit vector of the agent's facing direction
        forward, right = dx * heading[0] + dy * heading[1], -dx * heading[1] + dy * heading[0]
        rho = math.hypot(dx, dy)
        bearing = math.atan2(right, forward)
        return self.view, np.array([rho / self.size, math.cos(bearing), math.sin(bearing)], np.float32)

    def step(self, action: int) -> tuple[float, bool, bool]:
        """Take ``action``; return (reward, episode over, success)."""
        grid = self.env.unwrapped
        before = tuple(grid.agent_pos)
        obs, _, terminated, truncated, _ = self.env.step(action)
        after = tuple(grid.agent_pos)
        self.cells_moved += after != before
        self.view = obs["image"]
        success = bool(terminated) and after == self.goal
        reward = self.distance[before] - self.distance[after] + SUCCESS_REWARD * success + SLACK_REWARD
        return float(reward), bool(terminated or truncated), success


def _geodesic(grid: object, goal: tuple[int, int]) -> dict[tuple[int, int], int]:
    """Breadth-first distance (in cells) from every reachable cell to ``goal``."""
    distance, queue = {goal: 0}, deque([goal])
    while queue:
        i, j = queue.popleft()
        for cell in ((i + 1, j), (i - 1, j), (i, j + 1), (i, j - 1)):
            if cell in distance or not (0 <= cell[0] < grid.width and 0 <= cell[1] < grid.height):
                continue
            obj = grid.grid.get(*cell)
            if obj is None or obj.can_overlap():
                distance[cell] = distance[(i, j)] + 1
                queue.append(cell)
    return distance


class RolloutLoader:
    """This worker's PPO mini-batches for one epoch, collected with the live ``model``.

    The environments persist across rollouts and epochs, as in DD-PPO; each new episode takes the
    next seed of this worker's share of the seed pool (the sampler reshuffles it every epoch).
    """

    def __init__(self, seeds: Sampler, batch_size: int, model: nn.Module, device: torch.device) -> None:
        self.seeds, self.model, self.device = seeds, model, device
        self.steps = batch_size * NUM_MINI_BATCH // NUM_ENVS  # rollout length per environment
        if self.steps < 1:
            raise ValueError(f"Arg ``batch_size`` must be at least {NUM_ENVS // NUM_MINI_BATCH}, got {batch_size}.")
        self.envs = [NavEpisode() for _ in range(NUM_ENVS)]
        self._seed_stream: Iterator[int] | None = None

    def __len__(self) -> int:
        return ROLLOUTS_PER_EPOCH * PPO_EPOCHS * NUM_MINI_BATCH

    def __iter__(self) -> Iterator[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]]:
        self._seed_stream = itertools.cycle(list(self.seeds))
        if any(env.view is None for env in self.envs):
            for env in self.envs:
                env.reset(next(self._seed_stream))
        for _ in range(ROLLOUTS_PER_EPOCH):
            batch = self._collect()
            count = len(batch[0])
            for _ in range(PPO_EPOCHS):
                for index in torch.randperm(count).chunk(NUM_MINI_BATCH):
                    view, goal, action, logp, advantage, ret = (t[index] for t in batch)
                    yield (view, goal), (action, logp, advantage, ret)

    @torch.no_grad()
    def _collect(self) -> tuple[torch.Tensor, ...]:
        was_training = self.model.training
        self.model.eval()
        views, goals, actions, logps, values, rewards, dones = ([] for _ in range(7))
        for _ in range(self.steps):
            view, goal = (torch.as_tensor(np.stack(a)) for a in zip(*(env.observe() for env in self.envs)))
            logits, value = self.model((view.to(self.device), goal.to(self.device)))
            policy = torch.distributions.Categorical(logits=logits)
            action = policy.sample()
            step_rewards, step_dones = [], []
            for env, a in zip(self.envs, action.tolist()):
                reward, over, _ = env.step(a)
                if over:
                    env.reset(next(self._seed_stream))
                step_rewards.append(reward)
                step_dones.append(float(over))
            views.append(view)
            goals.append(goal)
            actions.append(action.cpu())
            logps.append(policy.log_prob(action).cpu())
            values.append(value.cpu())
            rewards.append(torch.tensor(step_rewards))
            dones.append(torch.tensor(step_dones))
        view, goal = (torch.as_tensor(np.stack(a)) for a in zip(*(env.observe() for env in self.envs)))
        last_value = self.model((view.to(self.device), goal.to(self.device)))[1].cpu()
        self.model.train(was_training)
        values_t = torch.stack(values)
        advantage = gae(torch.stack(rewards), values_t, torch.stack(dones), last_value)
        ret = advantage + values_t
        # Normalised advantages, as DD-PPO: the step size does not depend on the reward scale.
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-5)
        flat = lambda t: t.reshape(-1, *t.shape[2:])  # noqa: E731 - (T, N, ...) -> (T * N, ...)
        return (
            flat(torch.stack(views)),
            flat(torch.stack(goals)),
            flat(torch.stack(actions)),
            flat(torch.stack(logps)),
            flat(advantage),
            flat(ret),
        )


def make_loader(
    train_set: Dataset, sampler: Sampler, batch_size: int, model: nn.Module, device: torch.device
) -> RolloutLoader:
    return RolloutLoader(sampler, batch_size, model, device)


def evaluate(model: nn.Module, loader: Iterable, device: torch.device) -> tuple[float, float]:
    """Mean SPL over the validation episodes (and minus the mean return as the loss), job-wide.

    Actions are sampled from the policy, as Habitat's evaluation does, with a generator seeded by
    the episode seed, so a score does not depend on how episodes are split over workers.
    """
    score, returns, count = 0.0, 0.0, 0.0
    env = NavEpisode()
    for seeds in loader:
        for seed in torch.as_tensor(seeds).tolist():
            env.reset(seed)
            generator = torch.Generator().manual_seed(seed)  # a CPU generator: the policy is sampled there
            total, over, success = 0.0, False, False
            while not over:
                view, goal = env.observe()
                logits, _ = model((torch.as_tensor(view)[None].to(device), torch.as_tensor(goal)[None].to(device)))
                action = torch.multinomial(F.softmax(logits.float().cpu(), dim=1), 1, generator=generator).item()
                reward, over, success = env.step(action)
                total += reward
            score += spl(success, env.shortest, env.cells_moved)
            returns += total
            count += 1
    # Built on the evaluation device: NCCL reduces device tensors only (float64, as the CPU sums were).
    sums = torch.tensor([score, returns, count], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(sums)
    score, returns, count = sums.tolist()
    return -returns / count, score / count


TASK = Task(
    name="navigation_ddppo",
    description=("point-goal navigation, DD-PPO-style PPO on MiniGrid Empty-Random-6x6 (Habitat stand-in); SPL"),
    make_datasets=make_datasets,
    make_model=make_model,
    target=0.9,  # 2 ddp processes pass it at epoch 17 (39 s on 2 cores, DD-PPO's Adam)
    hparams={
        "batch_size": 128,  # experience steps per PPO mini-batch; a rollout is 2 envs x 128 steps
        "optimizer": "adam",
        "eps": 1e-5,
        "lr": 2.5e-4,
        "momentum": 0.0,  # SGD's; Adam's first moment is betas[0]
        "nesterov": False,
        "weight_decay": 0.0,
        "epochs": 40,
        "schedule": "constant",
        "warmup_epochs": 0,
        "milestones": [],
        "gamma": 0.1,
    },
    metric="spl",
    loss=ppo_loss,
    evaluate=evaluate,
    make_loader=make_loader,
)
