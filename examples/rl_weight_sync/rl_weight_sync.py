#!/usr/bin/python3
"""The rl_weight_sync example's learner: trains a small policy with REINFORCE on episodes that a
group of rollout actors (rollout.RolloutWorker, each holding the same torch model) play for it,
and after every step sends the new weights to every actor as one blob, down a chain.

    rl_weight_sync.py [--actors N] [--steps S] [--episodes E] [--fanout chain|star|tree]
                      [--resolver URL]

Each step gathers E episodes from each of the N actors, all played with the version the learner
sent last, updates the policy, and sends version <step> of its weights (one float32 vector,
sent from its own memory, no pickle) with broadcast_blob; each actor swaps them in between two
calls. It prints one line per step, then steps/s and whether the reward rose, and exits with
status 1 unless the reward rose, every broadcast reached every actor and every actor holds the
last version. The actors run as a job of a troupe.LocalLauncher, which publishes them in its own
registry, or in the one --resolver names.
"""

import argparse
import sys
import time

import numpy as np
import torch

import troupe
import rollout

LEARNING_RATE = 0.03
CALL_TIMEOUT = 60.0
READY_TIMEOUT = 120.0
BASE_SEED = 1  # actor i plays with seed BASE_SEED + i
TAIL = 3       # the final reward is the mean of the last TAIL steps'


def positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=positive, default=4, help="rollout actors (4)")
    parser.add_argument("--steps", type=positive, default=30, help="training steps (30)")
    parser.add_argument("--episodes", type=positive, default=32,
                        help="episodes per actor per step (32)")
    parser.add_argument("--fanout", choices=("chain", "star", "tree"), default="chain",
                        help="how the weights travel to the actors (chain)")
    parser.add_argument("--resolver", default="",
                        help="where the actors publish (default: the launcher's own registry)")
    return parser.parse_args(argv)


def gather(pool, episodes, version):
    """Every actor's episodes, checked to come from `version`: observations, actions and
    returns of all of them together, and the mean reward of an episode."""
    batches = []
    for r in pool.broadcast("rollout", episodes=episodes).wait_all(timeout=CALL_TIMEOUT):
        if not r.ok:
            raise SystemExit(f"rollout failed: {r.error}")
        if r.value.version != version:
            raise SystemExit(f"{r.endpoint} played version {r.value.version}, not {version}")
        batches.append(r.value)
    observations, actions, returns = (torch.from_numpy(np.concatenate(
        [getattr(b, field) for b in batches])) for field in ("observations", "actions", "returns"))
    reward = sum(b.mean_reward for b in batches) / len(batches)
    return observations, actions, returns, reward, len(batches)


def reinforce(policy, optimizer, observations, actions, returns):
    """One policy-gradient step: each action's log-probability, weighted by how much better
    than the batch's average its return from that step on was."""
    advantages = returns - returns.mean(dim=0, keepdim=True)
    advantages = advantages / (advantages.std() + 1e-6)
    log_probs = torch.log_softmax(policy(observations), dim=-1)
    taken = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    loss = -(taken * advantages).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def send_weights(pool, policy, version, fanout, count):
    """Sends `version` of `policy`'s weights to every actor; the seconds it took."""
    flat = torch.nn.utils.parameters_to_vector(policy.parameters()).detach().numpy()
    start = time.perf_counter()
    results = pool.broadcast_blob("policy", version, flat, fanout=fanout, timeout=CALL_TIMEOUT)
    seconds = time.perf_counter() - start
    failed = [r for r in results if not r.ok or r.bytes != flat.nbytes]
    if failed or len(results) != count:
        raise SystemExit(f"version {version} reached {len(results) - len(failed)} of {count} "
                         f"actors: {failed}")
    return seconds


def train(pool, options):
    """The training loop; the rewards, one per step, and the steps' wall time."""
    policy = rollout.make_policy(0)  # as each actor builds it: version 0
    size = sum(p.numel() for p in policy.parameters())
    print(f"the policy: {size} float32 parameters, {size * 4} bytes a version", flush=True)
    optimizer = torch.optim.Adam(policy.parameters(), lr=LEARNING_RATE)
    rewards = []
    start = time.perf_counter()
    for step in range(1, options.steps + 1):
        observations, actions, returns, reward, actors = gather(pool, options.episodes,
                                                                step - 1)
        reinforce(policy, optimizer, observations, actions, returns)
        seconds = send_weights(pool, policy, step, options.fanout, options.actors)
        rewards.append(reward)
        print(f"step {step}: reward {reward:.2f} from {actors} actors on version {step - 1}, "
              f"version {step} broadcast in {seconds * 1e3:.1f} ms ({options.fanout})",
              flush=True)
    return rewards, time.perf_counter() - start


def main(argv=None):
    options = parse(argv)
    torch.set_num_threads(1)  # the actors need the cores more
    with troupe.LocalLauncher(options.resolver) as launcher:
        group = launcher.create_actor_group(
            rollout.RolloutWorker, name="rollout", count=options.actors, args=(BASE_SEED,),
            resources=troupe.ResourceConfig.with_cpu(0.5, ram="1g"))
        try:
            group.wait_ready(options.actors, timeout=READY_TIMEOUT)
            print(f"{options.actors} rollout actors ready", flush=True)
            pool = group.pool()
            rewards, seconds = train(pool, options)
            held = pool.broadcast("version").wait_all(timeout=CALL_TIMEOUT)
        except BaseException:
            print("\n".join(group.launched.logs(20)), file=sys.stderr)
            raise
        group.close()

    print(f"steps/s: {options.steps / seconds:.1f}")
    for r in held:
        print(f"{r.endpoint} holds version {r.value if r.ok else r.error}")
    first, last = rewards[0], sum(rewards[-TAIL:]) / len(rewards[-TAIL:])
    stale = [r.endpoint for r in held if not r.ok or r.value != options.steps]
    if stale or len(held) != options.actors:
        raise SystemExit(f"not every actor holds version {options.steps}: {stale}")
    if last <= first:
        raise SystemExit(f"the reward did not rise: {first:.2f} to {last:.2f}")
    print(f"reward rose from {first:.2f} to {last:.2f}")
    print("rl weight sync demo passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
