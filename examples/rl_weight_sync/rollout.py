"""The rl_weight_sync example's shared parts: the task, the policy, and the rollout actor that
plays it. A module of its own, because replicas import the actor class by module path.

The task is a corridor of CELLS cells. Each episode puts the agent and a target in random cells;
for STEPS steps the agent moves left, stays or moves right, and scores 1 for every step it ends
on the target. A policy that acts at random scores about 1 per episode; one that walks to the
target and stays there scores about 8.
"""

import dataclasses
import os

import numpy as np
import torch

import troupe

CELLS = 9
STEPS = 10
MOVES = (-1, 0, 1)  # the actions: left, stay, right
HIDDEN = 32


def observe(position, target):
    """What the policy sees of a batch of episodes: where the agent is, where the target is,
    and which way it lies, each scaled to about [-1, 1]."""
    scale = (CELLS - 1) / 2
    return np.stack([position / scale - 1, target / scale - 1, (target - position) / scale,
                     np.sign(target - position)], axis=1).astype(np.float32)


OBSERVATION_SIZE = observe(np.zeros(1), np.zeros(1)).shape[1]


def make_policy(seed):
    """The policy network, its weights drawn from `seed`: observations in, one logit per
    action out. The learner and every rollout actor build the same one."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(OBSERVATION_SIZE, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, len(MOVES)))


def load_flat(policy, flat):
    """Copies `flat` (a float32 NumPy array of every parameter, in parameters() order, as
    parameters_to_vector lays them out) into `policy`'s parameters. Reads `flat` only, so a
    read-only view over received bytes will do."""
    offset = 0
    for parameter in policy.parameters():
        n = parameter.numel()
        parameter.detach().numpy()[...] = flat[offset:offset + n].reshape(parameter.shape)
        offset += n
    if offset != flat.size:
        raise ValueError(f"weights of {flat.size} floats for a policy of {offset}")


@dataclasses.dataclass
class Episodes:
    """A batch of episodes played with one version of the policy. `observations` is
    [episodes, STEPS, OBSERVATION_SIZE] float32, `actions` [episodes, STEPS] int64 (indexes
    into MOVES), `returns` [episodes, STEPS] float32 (the reward still to come from each step
    on); `mean_reward` the mean total reward of an episode."""
    observations: troupe.Tensor
    actions: troupe.Tensor
    returns: troupe.Tensor
    version: int
    mean_reward: float


@troupe.actor
class RolloutWorker:
    """Plays episodes with its copy of the policy, and takes each new version of the policy's
    weights as blob "policy" between calls."""

    def __init__(self, seed: int):
        # Each replica plays its own episodes: seed plus its index in the job.
        seed += int(os.environ.get("TROUPE_TASK_INDEX", "0"))
        torch.set_num_threads(1)  # replicas share the machine's cores
        self.policy = make_policy(0)  # version 0, which the learner builds alike
        self.held = 0
        self.random = np.random.default_rng(seed)
        self.generator = torch.Generator().manual_seed(seed)

    @troupe.on_blob("policy")
    def swap_in(self, version: int, data: memoryview) -> None:
        load_flat(self.policy, np.frombuffer(data, dtype=np.float32))
        self.held = version

    def version(self) -> int:
        return self.held

    def rollout(self, episodes: int) -> Episodes:
        position = self.random.integers(0, CELLS, episodes)
        target = self.random.integers(0, CELLS, episodes)
        observations = np.empty((episodes, STEPS, OBSERVATION_SIZE), np.float32)
        actions = np.empty((episodes, STEPS), np.int64)
        rewards = np.empty((episodes, STEPS), np.float32)
        with torch.no_grad():
            for t in range(STEPS):
                observations[:, t] = observe(position, target)
                logits = self.policy(torch.from_numpy(observations[:, t]))
                chosen = torch.multinomial(torch.softmax(logits, dim=1), 1,
                                           generator=self.generator)
                actions[:, t] = chosen[:, 0].numpy()
                position = np.clip(position + np.take(MOVES, actions[:, t]), 0, CELLS - 1)
                rewards[:, t] = position == target
        returns = np.flip(np.cumsum(np.flip(rewards, axis=1), axis=1), axis=1).copy()
        return Episodes(observations, actions, returns, self.held,
                        float(rewards.sum(axis=1).mean()))
