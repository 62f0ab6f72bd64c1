"""Household: a small text adventure in the shape of ALFWorld ("put the apple in the fridge").

A house has rooms; each room has receptacles; some receptacles open and close, and a closed one
hides what is inside. The agent is in one room, carries at most one object, and is given goals
"put X in/on Y". Every observation lists the admissible commands:

    look | inventory | go to ROOM | open R | close R | take OBJ | put OBJ in R (or "on R")

Names that are not in the current observation (an object hidden in a closed fridge, a
receptacle of another room, a thing that does not exist) raise the unknown_object event;
well-formed commands whose preconditions fail ("open" an open drawer, "take" with full hands)
raise no_effect. The oracle is a planner from the current state: deliver the held goal object
first, set down a held non-goal object, then for each unmet goal fetch the object (go, open,
take) and deliver it (go, open, put). Its plan length is the distance that progress / regress
events measure.
"""
from __future__ import annotations

import dataclasses
import random
import re
from typing import Hashable

from rised_jax.envs import base
from rised_jax.types import Event

ROOMS = {
    "kitchen": ("fridge", "cabinet", "counter", "microwave"),
    "living room": ("sofa", "table", "drawer", "shelf"),
    "bedroom": ("bed", "dresser", "desk", "wardrobe"),
    "bathroom": ("sink", "cupboard", "bathtub", "basket"),
}
OPENABLE = frozenset({"fridge", "cabinet", "microwave", "drawer", "dresser", "wardrobe",
                      "cupboard"})
SURFACES = frozenset({"counter", "sofa", "table", "shelf", "bed", "desk"})
OBJECTS = ("apple", "bread", "mug", "book", "keys", "remote", "towel", "soap", "pen", "phone",
           "plate", "candle", "pillow", "sponge", "glasses", "wallet")
HAND = "hand"  # the location of the held object
_ARTICLES_RE = re.compile(r"\b(?:the|a|an|some|my|your)\b\s*")
_COMMAND_PATTERNS = (
    ("look", re.compile(r"^(?:look|look around|l|examine room|describe)$")),
    ("inventory", re.compile(r"^(?:inventory|inv|i|check inventory)$")),
    ("go", re.compile(r"^(?:go to|go into|go|goto|walk to|move to|enter|head to|visit) (.+)$")),
    ("open", re.compile(r"^open (.+)$")),
    ("close", re.compile(r"^(?:close|shut) (.+)$")),
    ("take", re.compile(r"^(?:take|pick up|pick|get|grab) (.+?)(?: (?:from|off|out of) (.+))?$")),
    ("put", re.compile(r"^(?:put|place|drop|insert|store|set) (.+?) "
                       r"(?:in|into|inside|on|onto|on top of|in to) (.+)$")),
)
_ROOM_ALIASES = {"living": "living room", "livingroom": "living room", "lounge": "living room",
                 "bath": "bathroom", "bed room": "bedroom"}
_MAX_NAME_CHARS = 40


@dataclasses.dataclass(frozen=True)
class Command:
  """A parsed command: verb plus its object / receptacle / room names (not yet checked)."""

  verb: str
  target: str = ""   # the object, receptacle or room the verb acts on
  place: str = ""    # put: the receptacle; take: the optional "from" receptacle

  def __str__(self) -> str:
    if self.verb in ("look", "inventory"):
      return self.verb
    if self.verb == "go":
      return f"go to {self.target}"
    if self.verb == "put":
      return f"put {self.target} {preposition(self.place)} {self.place}"
    return f"{self.verb} {self.target}"


def preposition(receptacle: str) -> str:
  """'on' for surfaces (table, bed, …), 'in' for containers."""
  return "on" if receptacle in SURFACES else "in"


@dataclasses.dataclass
class World:
  """Everything a command can change, plus the fixed layout."""

  rooms: dict[str, tuple[str, ...]]          # room -> its receptacles (fixed)
  location: dict[str, str]                   # object -> receptacle or HAND
  opened: set[str]                           # openable receptacles that are open
  room: str                                  # where the agent is

  def room_of(self, receptacle: str) -> str:
    return next(room for room, recs in self.rooms.items() if receptacle in recs)

  def accessible(self, receptacle: str) -> bool:
    return receptacle not in OPENABLE or receptacle in self.opened

  def held(self) -> str | None:
    return next((obj for obj, where in self.location.items() if where == HAND), None)

  def visible_objects(self) -> list[str]:
    here = self.rooms[self.room]
    return [obj for obj, where in self.location.items() if where in here and self.accessible(where)]

  def copy(self) -> World:
    return World(self.rooms, dict(self.location), set(self.opened), self.room)


def plan(world: World, goals: list[tuple[str, str]]) -> list[Command]:
  """Commands that satisfy every goal (object, receptacle) from `world`; `world` is not changed."""
  sim = world.copy()
  steps: list[Command] = []

  def do(command: Command) -> None:
    steps.append(command)
    if command.verb == "go":
      sim.room = command.target
    elif command.verb == "open":
      sim.opened.add(command.target)
    elif command.verb == "take":
      sim.location[command.target] = HAND
    elif command.verb == "put":
      sim.location[command.target] = command.place

  def reach(receptacle: str) -> None:
    room = sim.room_of(receptacle)
    if sim.room != room:
      do(Command("go", room))
    if not sim.accessible(receptacle):
      do(Command("open", receptacle))

  held = sim.held()
  goal_of = dict(goals)
  if held is not None and held not in goal_of:
    # Set the stray object down in this room, on the first receptacle that needs no opening.
    here = sim.rooms[sim.room]
    spot = next((r for r in here if sim.accessible(r)), here[0])
    reach(spot)
    do(Command("put", held, spot))
  ordered = sorted(goals, key=lambda goal: goal[0] != held)  # the held goal object first
  for obj, receptacle in ordered:
    if sim.location[obj] == receptacle:
      continue
    if sim.location[obj] != HAND:
      reach(sim.location[obj])
      do(Command("take", obj))
    reach(receptacle)
    do(Command("put", obj, receptacle))
  return steps


class Household(base.Environment):
  """Put objects where the goals say, in a house of rooms and receptacles."""

  name = "household"
  default_max_turns = 12
  partial_view = True   # other rooms and closed containers are not shown

  def __init__(self, *, rooms: int = 3, receptacles: int = 3, objects: int = 4, goals: int = 1,
               max_turns: int | None = None, shaping: float = 0.0):
    super().__init__(max_turns=max_turns, shaping=shaping)
    self.num_rooms = base.check_int(self.name, "rooms", rooms, 1, len(ROOMS))
    self.num_receptacles = base.check_int(self.name, "receptacles", receptacles, 2, 4)
    self.num_objects = base.check_int(self.name, "objects", objects, 1, len(OBJECTS))
    self.num_goals = base.check_int(self.name, "goals", goals, 1, min(3, self.num_objects))

  @property
  def system_prompt(self) -> str:
    return (
        "You are a household robot in a house with several rooms. Containers such as the fridge "
        "or a drawer must be opened to see or reach what is inside. You can carry one object at "
        "a time. Commands: look, inventory, go to ROOM, open X, close X, take OBJECT, put OBJECT "
        "in X (or on X). Each observation lists the commands you can use now. Complete the task "
        f"within {self.max_turns} commands. {self.ANSWER_FORMAT} "
        "Example: <answer>open fridge</answer>")

  def action_space(self) -> list[str]:
    world = self.world
    here = world.rooms[world.room]
    held = world.held()
    commands = [Command("look"), Command("inventory")]
    commands += [Command("go", room) for room in world.rooms if room != world.room]
    for receptacle in here:
      if receptacle in OPENABLE:
        commands.append(Command("close" if receptacle in world.opened else "open", receptacle))
    if held is None:
      commands += [Command("take", obj) for obj in world.visible_objects()]
    else:
      commands += [Command("put", held, r) for r in here if world.accessible(r)]
    return [str(command) for command in commands]

  def _generate(self, rng: random.Random) -> None:
    room_names = rng.sample(sorted(ROOMS), self.num_rooms)
    rooms = {room: tuple(rng.sample(ROOMS[room], self.num_receptacles)) for room in room_names}
    receptacles = [r for recs in rooms.values() for r in recs]
    objects = rng.sample(OBJECTS, self.num_objects)
    location = {obj: rng.choice(receptacles) for obj in objects}
    self.world = World(rooms, location, set(), rng.choice(room_names))
    self.goals = [(obj, rng.choice([r for r in receptacles if r != location[obj]]))
                  for obj in rng.sample(objects, self.num_goals)]
    self.start = (tuple(sorted((room, tuple(sorted(recs))) for room, recs in rooms.items())),
                  tuple(sorted(location.items())), self.world.room, tuple(sorted(self.goals)))

  def _parse(self, candidate: str) -> Command | None:
    text = _ARTICLES_RE.sub("", candidate).strip()
    for verb, pattern in _COMMAND_PATTERNS:
      match = pattern.match(text)
      if match is None:
        continue
      names = [name.strip() for name in match.groups() if name is not None]
      if any(not name or len(name) > _MAX_NAME_CHARS for name in names):
        return None
      if verb == "go":
        names[0] = _ROOM_ALIASES.get(names[0], names[0])
      if verb == "put":
        return Command(verb, names[0], names[1])
      return Command(verb, *names)
    return None

  def _apply(self, command: Command) -> base.Outcome:
    before = len(plan(self.world, self.goals))
    outcome = self._execute(command)
    if outcome.executed:
      after = len(plan(self.world, self.goals))
      if after < before:
        outcome.events.append(Event.PROGRESS.value)
      elif after > before:
        outcome.events.append(Event.REGRESS.value)
      outcome.success = self._goals_met()
    return outcome

  def _execute(self, command: Command) -> base.Outcome:
    world = self.world
    here = world.rooms[world.room]
    verb, target, place = command.verb, command.target, command.place
    if verb == "look":
      return base.Outcome("You look around.")
    if verb == "inventory":
      held = world.held()
      return base.Outcome(f"You are holding the {held}." if held else "You are holding nothing.")
    if verb == "go":
      if target not in world.rooms:
        return _unknown(f'There is no room called "{target}". Rooms: {", ".join(world.rooms)}.')
      if target == world.room:
        return base.Outcome(f"You are already in the {target}.", [Event.NO_EFFECT.value])
      world.room = target
      return base.Outcome(f"You go to the {target}.")
    if verb in ("open", "close"):
      if target not in here:
        return _unknown(f'You see no "{target}" here.')
      if target not in OPENABLE:
        return base.Outcome(f"The {target} cannot be opened or closed.", [Event.NO_EFFECT.value])
      if (verb == "open") == (target in world.opened):
        state = "open" if target in world.opened else "closed"
        return base.Outcome(f"The {target} is already {state}.", [Event.NO_EFFECT.value])
      if verb == "open":
        world.opened.add(target)
        inside = [obj for obj, where in world.location.items() if where == target]
        return base.Outcome(f"You open the {target}. Inside: {', '.join(inside) or 'nothing'}.")
      world.opened.discard(target)
      return base.Outcome(f"You close the {target}.")
    if verb == "take":
      held = world.held()
      if target == held:
        return base.Outcome(f"You already hold the {target}.", [Event.NO_EFFECT.value])
      if target not in world.visible_objects() or (place and world.location[target] != place):
        return _unknown(f'You see no "{target}"{f" in the {place}" if place else ""} here.')
      if held is not None:
        return base.Outcome(f"Your hands are full: you hold the {held}.", [Event.NO_EFFECT.value])
      world.location[target] = HAND
      return base.Outcome(f"You take the {target}.")
    # put
    if place not in here:
      return _unknown(f'You see no "{place}" here.')
    if world.location.get(target) != HAND:
      if target in world.visible_objects():
        return base.Outcome(f"You are not holding the {target}.", [Event.NO_EFFECT.value])
      return _unknown(f'You are not holding any "{target}".')
    if not world.accessible(place):
      return base.Outcome(f"The {place} is closed.", [Event.NO_EFFECT.value])
    world.location[target] = place
    return base.Outcome(f"You put the {target} {preposition(place)} the {place}.")

  def _goals_met(self) -> bool:
    return all(self.world.location[obj] == receptacle for obj, receptacle in self.goals)

  def _render(self) -> str:
    world = self.world
    seen = []
    for receptacle in world.rooms[world.room]:
      if not world.accessible(receptacle):
        seen.append(f"{receptacle} (closed)")
        continue
      inside = [obj for obj, where in world.location.items() if where == receptacle]
      state = "open: " if receptacle in OPENABLE else ""
      seen.append(f"{receptacle} ({state}{', '.join(inside) or 'empty'})")
    others = [room for room in world.rooms if room != world.room]
    task = "; ".join(f"put the {obj} {preposition(r)} the {r}" for obj, r in self.goals)
    return (f"You are in the {world.room}. You see: {'; '.join(seen)}.\n"
            f"Other rooms: {', '.join(others) or 'none'}. You hold: {world.held() or 'nothing'}.\n"
            f"Task: {task}.\nCommands: {', '.join(self.action_space())}.")

  def _state_key(self) -> Hashable:
    world = self.world
    return (world.room, tuple(sorted(world.location.items())), tuple(sorted(world.opened)))

  def _instance(self) -> tuple:
    return self.start   # listing order (rooms, receptacles) is presentation, not the game

  def _situation(self, first_observation: str) -> Hashable:
    # What the first observation shows, and the oracle's plan, both in a canonical order:
    # listing order is presentation (as in `_instance`), so one game has one key however it
    # is listed, and games that differ only out of sight (other rooms, closed containers)
    # and are won by the same commands share it.
    del first_observation
    world = self.world
    seen = tuple(sorted((r, tuple(sorted(o for o, where in world.location.items() if where == r))
                         if world.accessible(r) else None) for r in world.rooms[world.room]))
    view = (world.room, seen, tuple(sorted(world.rooms)), tuple(sorted(self.goals)))
    return view, tuple(str(command) for command in plan(world, sorted(self.goals)))

  def _solve(self) -> list[str]:
    return [str(command) for command in plan(self.world, self.goals)]

  def _format_hint(self) -> str:
    return "Answer with one of the listed commands, e.g. <answer>look</answer>."


def _unknown(feedback: str) -> base.Outcome:
  return base.Outcome(feedback, [Event.UNKNOWN_OBJECT.value], executed=False)
