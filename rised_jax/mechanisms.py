"""Pre-checks of the RISED mechanism suite (experiments/configs/mechanisms_rised.py), before any RL.

  python -m rised_jax.mechanisms precheck --model runs/doors_model [--out precheck.json]

Each line says whether a mechanism has something to act on with the warm-started model
(`python -m rised_jax.warmstart runs/doors_model --game doors ...`, the suite config's
recipe), measured on the held-out instances of the suite's games (rised_jax.envs.doors; the
seeds the evaluation uses, `evaluate.eval_instances`). Replies are one door token after the
reply prefix, so the probability of a door's token is exactly the frequency with which
rollouts at temperature 1 open it.

  constant   per game, the pass rate of the best constant policy (one door for every
             instance): what a learning claim must beat.
  teacher    on `doors`, mean p(winning door | teacher prompt) - p(winning door | student
             prompt). The teacher prompt is the one RISED builds for a group with a won
             rollout (`positive.positive_teacher_prefix`, the won rollout played through the
             game and tagged by the rule judge); its positives name no door, so an
             all-failure group that takes them from the pool or the memory gets the same
             prompt. Holds at >= 0.3 with the teacher's own p(win) >= 0.9 (a teacher
             that follows the line).
  guidance   on `trapdoors`, the trap's frequency p(black) under the student prompt, and
             under the student prompt with the hint `GuidanceMemory` shows once the trap's tag
             is frequent ("Avoid: Opens with black."). Holds when the failure recurs (above
             the suite's hint threshold, GUIDANCE_THRESHOLD) and the hint lowers it.
  selection  on pools of the suite (K groups of G = 4 rollouts drawn from the student's own
             reply distribution on training instances of both games, played and tagged by the
             rule judge), the RISED selector's batch of B against a random batch of B:
             `gap_ratio` = mean ||batch mean profile - pool mean profile||^2 over pools,
             divided by its exact expectation for a uniform random batch, and the share of
             each game in the batches. Holds when the ratio is below 0.5 (the selector makes
             batches measurably closer to the pool's composition than chance).
"""
from __future__ import annotations

import argparse
import json
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rised_jax import envs, evaluate
from rised_jax.envs import doors
from rised_jax.model import from_pretrained
from rised_jax.rollout.chat import ChatFormat, join_system_text
from rised_jax.rubrics import Vocabulary
from rised_jax.rubrics.rule_judge import RuleBasedJudge
from rised_jax.select import make_selector
from rised_jax.select.rised import behaviour_profiles
from rised_jax.teach import guidance, positive
from rised_jax.teach.action_mass import next_token_logits
from rised_jax.types import Group, GroupTags, Task, Trajectory, Turn

REPLY_PREFIX = "<answer>"
SEED_OFFSET = 1_000_000   # config.eval.seed_offset
HELD_OUT = 32             # config.eval.episodes_per_env
TEACHER_BAR = 0.3
# A warm-start that stopped half-way (teacher p(win) 0.676, gap 0.483) passed the gap bar alone,
# and RISED then did not beat rised_no_teacher (docs/rised.md, "Across machines").
TEACHER_WIN_BAR = 0.9
GAP_RATIO_BAR = 0.5
GUIDANCE_THRESHOLD = 0.1  # the suite's guidance.options.threshold
GROUP_SIZE = 4            # the suite's rollout.group_size
VOCABULARY = "rised_jax.envs.doors:VOCABULARY"


def register_games() -> None:
  for name in doors.SUITE_GAMES:
    envs.register(name, doors.PATH)


def held_out(game: str, episodes: int = HELD_OUT) -> list[Task]:
  return evaluate.eval_instances(game, doors.SUITE_GAMES[game], episodes, SEED_OFFSET)


def play(task: Task, door: str) -> Trajectory:
  """The one-turn rollout of `task` that opens `door`, as the agent loop records it."""
  env = envs.make(task.env, **task.difficulty)
  env.reset(task.seed)
  observation, reward, done, info = env.step(REPLY_PREFIX + door)
  turn = Turn(door, observation, reward, done, info["invalid"], list(info["events"]))
  return Trajectory(task, [], [], [], 0, [turn], success=bool(info["success"]),
                    reward=float(reward))


def judged_group(task: Task, opened: Sequence[str], judge: RuleBasedJudge
                 ) -> tuple[Group, GroupTags]:
  """The group of rollouts of `task` that open the doors `opened`, and the rule judge's tags."""
  env = envs.make(task.env, **task.difficulty)
  first = env.reset(task.seed)
  group = Group(task, [play(task, door) for door in opened], env.system_prompt, first)
  verdicts, _ = judge.judge_trajectories(group.trajectories)
  return group, GroupTags(np.stack([v.tags for v in verdicts]),
                          np.zeros(len(verdicts), bool))


def door_probabilities(model, chat: ChatFormat, prompts: Sequence[tuple[str, str]],
                       moves: Sequence[str]) -> np.ndarray:
  """[N, len(moves)] probability of each door's token after each (system text, observation)."""
  logits = next_token_logits(model, [chat.prompt_ids(s, o) for s, o in prompts])
  probs = np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32)))
  ids = [chat.tokenizer.encode(m)[0] for m in moves]
  return probs[:, ids]


def constant_baselines() -> dict[str, dict[str, float | str]]:
  out = {}
  for game, knobs in doors.SUITE_GAMES.items():
    rate, door = doors.best_constant_pass_rate(doors.Doors(**knobs),
                                               [t.seed for t in held_out(game)])
    out[game] = {"pass_rate": rate, "door": door}
  return out


def teacher_check(model, chat: ChatFormat, vocab: Vocabulary) -> dict[str, float | bool]:
  judge = RuleBasedJudge(vocab)
  teacher, student, wins = [], [], []
  tasks = held_out("doors")
  env = envs.make("doors", **doors.SUITE_GAMES["doors"])
  for task in tasks:
    win = doors.winning_door(env, task.seed)
    loser = next(d for d in env.action_space() if d != win)
    group, tags = judged_group(task, [win, loser, loser, loser], judge)
    prefix, _ = positive.positive_teacher_prefix(group.system_prompt, 0, [group], [tags], vocab)
    teacher.append((prefix, group.first_observation))
    student.append((group.system_prompt, group.first_observation))
    wins.append(env.action_space().index(win))
  moves = env.action_space()
  rows = np.arange(len(tasks))
  return teacher_summary(door_probabilities(model, chat, teacher, moves)[rows, wins],
                         door_probabilities(model, chat, student, moves)[rows, wins])


def teacher_summary(p_teacher: np.ndarray, p_student: np.ndarray) -> dict[str, float | bool]:
  """The teacher check from p(winning door) per held-out instance under the teacher and the
  student prompts: it holds when the teacher wins on average (>= TEACHER_WIN_BAR) and raises
  the win by >= TEACHER_BAR over the student."""
  teacher_p_win = float(np.mean(p_teacher))
  gap = float(np.mean(p_teacher - p_student))
  return {"teacher_p_win": teacher_p_win, "student_p_win": float(np.mean(p_student)),
          "all_failure_groups": float(np.mean((1.0 - p_student) ** GROUP_SIZE)),
          "teacher_minus_student": gap,
          "holds": gap >= TEACHER_BAR and teacher_p_win >= TEACHER_WIN_BAR,
          "held_out": len(p_teacher)}


def guidance_check(model, chat: ChatFormat, vocab: Vocabulary) -> dict[str, float | bool | str]:
  memory = guidance.GuidanceMemory(vocab, threshold=GUIDANCE_THRESHOLD)
  trap_tag = "event." + doors.EVENT.format(door=doors.TRAP)
  tasks = held_out("trapdoors")
  judge = RuleBasedJudge(vocab)
  # The memory after one step in which every rollout opened the trap: the hint it then shows.
  memory.update(*zip(*[judged_group(t, [doors.TRAP], judge) for t in tasks[:1]]))
  hint = memory.hint("trapdoors")
  env = envs.make("trapdoors", **doors.SUITE_GAMES["trapdoors"])
  observations = [env.reset(t.seed) for t in tasks]
  trap = env.action_space().index(doors.TRAP)
  plain = door_probabilities(model, chat, [(env.system_prompt, o) for o in observations],
                             env.action_space())[:, trap]
  hinted = door_probabilities(model, chat, [(join_system_text(env.system_prompt, hint), o)
                                            for o in observations], env.action_space())[:, trap]
  return {"hint": hint, "tag": trap_tag, "student_p_trap": float(plain.mean()),
          "hinted_p_trap": float(hinted.mean()),
          "holds": bool(GUIDANCE_THRESHOLD < plain.mean() and hinted.mean() < plain.mean()),
          "held_out": len(tasks)}


def random_gap(profiles: np.ndarray, batch: int) -> float:
  """E ||mean of a uniform random `batch`-subset of the rows - mean of all rows||^2, exactly:
  (K - B) / (B (K - 1)) times the rows' mean squared distance from their mean."""
  k = len(profiles)
  spread = ((profiles - profiles.mean(0)) ** 2).sum(1).mean()
  return float((k - batch) / (batch * (k - 1)) * spread)


def selection_check(model, chat: ChatFormat, vocab: Vocabulary, pools: int = 16,
                    pool_groups: int = 16, batch_groups: int = 4, group_size: int = GROUP_SIZE,
                    seed: int = 0) -> dict[str, float | bool]:
  rng = np.random.default_rng(seed)
  judge = RuleBasedJudge(vocab)
  held = {envs.instance_key(t.env, t.seed, t.difficulty)
          for game in doors.SUITE_GAMES for t in held_out(game)}
  selector = make_selector("rised")
  gaps, expected, shares = [], [], []
  for p in range(pools):
    tasks = []
    while len(tasks) < pool_groups:
      game = list(doors.SUITE_GAMES)[len(tasks) % len(doors.SUITE_GAMES)]
      task = Task(game, int(rng.integers(SEED_OFFSET)), doors.SUITE_GAMES[game])
      if envs.instance_key(task.env, task.seed, task.difficulty) not in held:
        tasks.append(task)
    pool, tags = [], []
    for task in tasks:
      env = envs.make(task.env, **task.difficulty)
      observation = env.reset(task.seed)
      probs = door_probabilities(model, chat, [(env.system_prompt, observation)],
                                 env.action_space())[0]
      opened = rng.choice(env.action_space(), size=group_size, p=probs / probs.sum())
      group, group_tags = judged_group(task, list(opened), judge)
      pool.append(group)
      tags.append(group_tags)
    profiles = behaviour_profiles(pool, tags, with_success=False)
    chosen = selector.select(pool, batch_groups, p, tags)
    gaps.append(float(((profiles[chosen].mean(0) - profiles.mean(0)) ** 2).sum()))
    expected.append(random_gap(profiles, batch_groups))
    shares.append(np.mean([pool[i].task.env == "doors" for i in chosen]))
  ratio = float(np.mean(gaps) / np.mean(expected))
  return {"gap_ratio": ratio, "rised_doors_share": float(np.mean(shares)),
          "random_doors_share": 0.5, "holds": ratio < GAP_RATIO_BAR, "pools": pools}


def precheck(model_dir: str) -> dict[str, dict]:
  register_games()
  model, tokenizer = from_pretrained(model_dir)
  chat = ChatFormat(tokenizer, REPLY_PREFIX)
  vocab = Vocabulary.load(VOCABULARY)
  return {"constant": constant_baselines(), "teacher": teacher_check(model, chat, vocab),
          "guidance": guidance_check(model, chat, vocab),
          "selection": selection_check(model, chat, vocab)}


def lines(report: dict[str, dict]) -> list[str]:
  """One line per pre-check, as the command prints them."""
  t, g, s = report["teacher"], report["guidance"], report["selection"]
  out = [f"constant  {game}: best constant door {c['door']!r} wins {c['pass_rate']:.3f} of the "
         "held-out instances" for game, c in report["constant"].items()]
  out.append(f"teacher   {'holds' if t['holds'] else 'FAILS'}: p(win) teacher "
             f"{t['teacher_p_win']:.3f} (bar {TEACHER_WIN_BAR}) - student "
             f"{t['student_p_win']:.3f} = {t['teacher_minus_student']:.3f} (bar {TEACHER_BAR}; "
             f"{t['held_out']} held out); "
             f"all-failure groups of {GROUP_SIZE}: {t['all_failure_groups']:.3f}")
  out.append(f"guidance  {'holds' if g['holds'] else 'FAILS'}: p(trap) {g['student_p_trap']:.3f}"
             f" -> {g['hinted_p_trap']:.3f} with the hint {g['hint']!r} (needs > "
             f"{GUIDANCE_THRESHOLD} before, lower after)")
  out.append(f"selection {'holds' if s['holds'] else 'FAILS'}: gap ratio {s['gap_ratio']:.3f} "
             f"of random's (bar {GAP_RATIO_BAR}; {s['pools']} pools); doors share of the batch "
             f"{s['rised_doors_share']:.3f} (random {s['random_doors_share']:.3f})")
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="command", required=True)
  check = sub.add_parser("precheck", help="the pre-checks on a warm-started model")
  check.add_argument("--model", default="runs/doors_model")
  check.add_argument("--out", default="", help="also write the report as JSON here")
  args = parser.parse_args()
  report = precheck(args.model)
  print("\n".join(lines(report)))
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(report, f, indent=2)


if __name__ == "__main__":
  main()
