"""Grade-school math word problems with worked solutions (the GSM8K-like `math` stream).

No GSM8K package exists on our registries, so we generate problems ourselves. Every problem is a
pure function of an integer seed (``make_problem(seed)``), so train and test splits are reproducible
and disjoint by seed range. Each solution step states its arithmetic as ``a op b = c`` with integers
only, and the last line is ``#### <answer>`` like GSM8K, so tests can re-check every equation.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

NAMES = [
    "Ava",
    "Ben",
    "Carla",
    "Diego",
    "Emma",
    "Farid",
    "Grace",
    "Hiro",
    "Isla",
    "Jamal",
    "Keiko",
    "Liam",
    "Maya",
    "Noah",
    "Olga",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tara",
    "Umar",
    "Vera",
    "Wes",
    "Xena",
    "Yusuf",
    "Zoe",
]
ITEMS = [
    ("notebook", "notebooks"),
    ("pencil", "pencils"),
    ("apple", "apples"),
    ("sticker", "stickers"),
    ("marble", "marbles"),
    ("cupcake", "cupcakes"),
    ("toy car", "toy cars"),
    ("book", "books"),
    ("bottle of juice", "bottles of juice"),
    ("pack of cards", "packs of cards"),
]


@dataclass(frozen=True)
class Step:
    text: str  # the sentence shown in the solution; contains `expr = value`
    expr: str  # integer arithmetic with + - * / and parentheses, evaluable by eval()
    value: int


@dataclass(frozen=True)
class Problem:
    seed: int
    template: str
    question: str
    steps: tuple[Step, ...]
    answer: int

    @property
    def solution(self) -> str:
        return "\n".join(s.text for s in self.steps) + f"\n#### {self.answer}"

    def as_text(self) -> str:
        """The training/eval rendering: the same "Question: ...\\nAnswer:" frame as the stream prompts."""
        return f"Question: {self.question}\nAnswer: {self.solution}"


class _Builder:
    """Collects steps; `eq` evaluates the expression so a step can never state wrong arithmetic."""

    def __init__(self) -> None:
        self.steps: list[Step] = []

    def eq(self, template: str, expr: str) -> int:
        value = eval(expr, {"__builtins__": {}})  # our own literal expressions only
        if value != int(value):
            raise ValueError(f"non-integer step {expr} = {value}")
        value = int(value)
        self.steps.append(Step(template.format(eq=f"{expr} = {value}", v=value), expr, value))
        return value


def _pick(r: random.Random, *variants: str) -> str:
    return r.choice(variants)


def _shopping(r: random.Random, b: _Builder) -> str:
    n = r.choice(NAMES)
    (i1, p1), (i2, p2) = r.sample(ITEMS, 2)
    a, pa, c, pc = r.randint(2, 9), r.randint(2, 12), r.randint(2, 9), r.randint(1, 8)
    bill = r.choice([50, 100, 200])
    while a * pa + c * pc > bill:
        a = max(1, a - 1)
        c = max(1, c - 1)
    q = _pick(
        r,
        f"{n} buys {a} {p1} at ${pa} each and {c} {p2} at ${pc} each. {n} pays with a ${bill} bill. How much change does {n} get?",
        f"At the store, {n} picks up {a} {p1} that cost ${pa} apiece and {c} {p2} that cost ${pc} apiece. If {n} hands the cashier ${bill}, how many dollars of change come back?",
    )
    x = b.eq(f"The {p1} cost {{eq}} dollars.", f"{a} * {pa}")
    y = b.eq(f"The {p2} cost {{eq}} dollars.", f"{c} * {pc}")
    t = b.eq("Altogether that is {eq} dollars.", f"{x} + {y}")
    b.eq("The change is {eq} dollars.", f"{bill} - {t}")
    return q


def _rates(r: random.Random, b: _Builder) -> str:
    n = r.choice(NAMES)
    s1, h1, s2, h2 = r.randint(20, 70), r.randint(2, 5), r.randint(10, 60), r.randint(2, 4)
    vehicle = r.choice(["car", "bus", "truck", "motorbike"])
    q = _pick(
        r,
        f"{n} drives a {vehicle} at {s1} miles per hour for {h1} hours, then at {s2} miles per hour for {h2} hours. How many miles does {n} travel in total?",
        f"A {vehicle} travels for {h1} hours at {s1} mph and then slows to {s2} mph for another {h2} hours. What is the total distance in miles?",
    )
    d1 = b.eq("In the first part it covers {eq} miles.", f"{s1} * {h1}")
    d2 = b.eq("In the second part it covers {eq} miles.", f"{s2} * {h2}")
    b.eq("The total distance is {eq} miles.", f"{d1} + {d2}")
    return q


def _fractions(r: random.Random, b: _Builder) -> str:
    n = r.choice(NAMES)
    sing, plural = r.choice(ITEMS)
    k = r.choice([2, 3, 4, 5])
    total = k * r.randint(4, 20)
    m = r.randint(1, total - total // k - 1)
    q = _pick(
        r,
        f"{n} has {total} {plural}. {n} gives 1/{k} of them to a brother and then {m} to a friend. How many {plural} does {n} have left?",
        f"There are {total} {plural} in a box. {n} takes out 1/{k} of them, and later removes {m} more. How many {plural} remain in the box?",
    )
    g = b.eq(f"1/{k} of {total} is {{eq}}.", f"{total} / {k}")
    left = b.eq("After the first step there are {eq} left.", f"{total} - {g}")
    b.eq("After the second step there are {eq} left.", f"{left} - {m}")
    return q


def _ages(r: random.Random, b: _Builder) -> str:
    a, c, d = r.sample(NAMES, 3)
    z = r.randint(3, 12)
    k = r.randint(2, 4)
    diff = r.randint(2, 15)
    q = _pick(
        r,
        f"{d} is {z} years old. {c} is {k} times as old as {d}, and {a} is {diff} years older than {c}. What is the sum of their ages?",
        f"{c}'s age is {k} times {d}'s age, and {a} is {diff} years older than {c}. If {d} is {z}, how old are the three of them together?",
    )
    y = b.eq(f"{c} is {{eq}} years old.", f"{k} * {z}")
    x = b.eq(f"{a} is {{eq}} years old.", f"{y} + {diff}")
    b.eq("Together they are {eq} years old.", f"{x} + {y} + {z}")
    return q


def _wages(r: random.Random, b: _Builder) -> str:
    n = r.choice(NAMES)
    w, h, d = r.randint(8, 25), r.randint(2, 8), r.randint(3, 6)
    spend = r.randint(10, w * h * d // 2)
    q = _pick(
        r,
        f"{n} earns ${w} an hour and works {h} hours a day for {d} days. {n} then spends ${spend}. How much money is left?",
        f"A part-time job pays {n} {w} dollars per hour. {n} works {h} hours each day for {d} days and buys a gift for {spend} dollars. How many dollars does {n} keep?",
    )
    day = b.eq("Each day the pay is {eq} dollars.", f"{w} * {h}")
    tot = b.eq(f"Over {d} days that is {{eq}} dollars.", f"{day} * {d}")
    b.eq("After spending, {eq} dollars are left.", f"{tot} - {spend}")
    return q


def _discount(r: random.Random, b: _Builder) -> str:
    n = r.choice(NAMES)
    pct = r.choice([10, 20, 25, 50])
    price = 20 * r.randint(2, 20)
    qty = r.randint(2, 5)
    thing = r.choice(["jacket", "lamp", "bicycle helmet", "board game", "pair of shoes"])
    q = _pick(
        r,
        f"A {thing} costs ${price}. It is on sale for {pct}% off. {n} buys {qty} of them. How much does {n} pay?",
        f"{n} wants {qty} of a {thing} priced at ${price} each. The shop takes {pct}% off the price. What is the total cost in dollars?",
    )
    off = b.eq("The discount on one is {eq} dollars.", f"{price} * {pct} / 100")
    one = b.eq("One now costs {eq} dollars.", f"{price} - {off}")
    b.eq(f"For {qty} of them {n} pays {{eq}} dollars.", f"{one} * {qty}")
    return q


def _baking(r: random.Random, b: _Builder) -> str:
    n = r.choice(NAMES)
    box = r.choice([4, 6, 8, 12])
    batches = r.randint(2, 6)
    per = r.randint(10, 24)
    eaten = (batches * per) % box + box * r.randint(0, 2)
    while eaten >= batches * per:
        eaten -= box
    q = _pick(
        r,
        f"{n} bakes {batches} batches of cookies with {per} cookies in each batch. The family eats {eaten} cookies and {n} packs the rest into boxes of {box}. How many boxes does {n} fill?",
        f"For a bake sale, {n} makes {batches} trays of {per} muffins. {eaten} muffins are eaten, and the others go into boxes that hold {box} each. How many boxes are filled?",
    )
    tot = b.eq("There are {eq} baked in total.", f"{batches} * {per}")
    rest = b.eq("After eating, {eq} are left.", f"{tot} - {eaten}")
    b.eq("The number of boxes is {eq}.", f"{rest} / {box}")
    return q


def _garden(r: random.Random, b: _Builder) -> str:
    n = r.choice(NAMES)
    rows, per, fruit = r.randint(3, 12), r.randint(4, 15), r.randint(2, 9)
    crop = r.choice([("tomato plants", "tomatoes"), ("pepper plants", "peppers"), ("bean plants", "pods")])
    q = _pick(
        r,
        f"{n} plants {rows} rows of {crop[0]} with {per} plants in each row. Each plant gives {fruit} {crop[1]}. How many {crop[1]} does {n} harvest?",
        f"A garden has {rows} rows, and every row holds {per} {crop[0]}. If each plant produces {fruit} {crop[1]}, how many {crop[1]} are picked in all?",
    )
    plants = b.eq("There are {eq} plants.", f"{rows} * {per}")
    b.eq(f"They give {{eq}} {crop[1]}.", f"{plants} * {fruit}")
    return q


def _reading(r: random.Random, b: _Builder) -> str:
    n = r.choice(NAMES)
    per = r.randint(5, 30)
    days = r.randint(3, 15)
    done = r.randint(10, 80)
    pages = done + per * days
    q = _pick(
        r,
        f"A book has {pages} pages. {n} has already read {done} pages and reads {per} pages a day. How many more days will it take {n} to finish?",
        f"{n} is reading a {pages}-page novel. After reading {done} pages, {n} plans to read {per} pages every day. In how many days will the book be finished?",
    )
    left = b.eq("There are {eq} pages left.", f"{pages} - {done}")
    b.eq("That takes {eq} days.", f"{left} / {per}")
    return q


def _sharing(r: random.Random, b: _Builder) -> str:
    n = r.choice(NAMES)
    kids = r.randint(2, 8)
    each = r.randint(3, 15)
    keep = r.randint(1, 20)
    bags = r.randint(2, 5)
    total = kids * each + keep
    while total % bags:
        keep += 1
        total += 1
    q = _pick(
        r,
        f"{n} buys {bags} bags with {total // bags} candies in each bag. {n} keeps {keep} candies and shares the rest equally among {kids} children. How many candies does each child get?",
        f"There are {bags} bags of candy, each holding {total // bags} pieces. After {n} sets aside {keep} pieces, the remaining candy is split evenly between {kids} kids. How many pieces does each kid receive?",
    )
    tot = b.eq("There are {eq} candies.", f"{bags} * {total // bags}")
    rest = b.eq("After keeping some, {eq} are shared.", f"{tot} - {keep}")
    b.eq("Each child gets {eq}.", f"{rest} / {kids}")
    return q


def _comparison(r: random.Random, b: _Builder) -> str:
    a, c, d = r.sample(NAMES, 3)
    x = r.randint(5, 30)
    k = r.randint(2, 5)
    fewer = r.randint(1, k * x - 1)
    sing, plural = r.choice(ITEMS)
    q = _pick(
        r,
        f"{a} has {x} {plural}. {c} has {k} times as many {plural} as {a}, and {d} has {fewer} fewer than {c}. How many {plural} do they have altogether?",
        f"{c} owns {k} times as many {plural} as {a}, who owns {x}. {d} owns {fewer} fewer {plural} than {c}. What is the total number of {plural}?",
    )
    y = b.eq(f"{c} has {{eq}}.", f"{k} * {x}")
    z = b.eq(f"{d} has {{eq}}.", f"{y} - {fewer}")
    b.eq("Altogether they have {eq}.", f"{x} + {y} + {z}")
    return q


def _ribbon(r: random.Random, b: _Builder) -> str:
    n = r.choice(NAMES)
    piece = r.choice([2, 3, 4, 6, 8])
    feet = piece * r.randint(1, 10)
    q = _pick(
        r,
        f"{n} has a ribbon {feet} feet long and cuts it into pieces that are {piece} inches long. How many pieces does {n} get?",
        f"A roll of ribbon is {feet} feet long. If every piece must be {piece} inches, how many pieces can be cut from the roll?",
    )
    inches = b.eq("One foot is 12 inches, so the ribbon is {eq} inches.", f"{feet} * 12")
    b.eq("The number of pieces is {eq}.", f"{inches} / {piece}")
    return q


def _savings(r: random.Random, b: _Builder) -> str:
    n = r.choice(NAMES)
    weekly, weeks, have = r.randint(5, 25), r.randint(2, 15), 5 * r.randint(1, 30)
    goal = have + weekly * weeks
    thing = r.choice(["a bike", "a guitar", "a video game", "a telescope"])
    q = _pick(
        r,
        f"{n} wants to buy {thing} that costs ${goal}. {n} has saved ${have} and saves ${weekly} each week. How many weeks until {n} can buy it?",
        f"{thing.capitalize()} costs {goal} dollars. {n} already has {have} dollars and puts away {weekly} dollars every week. After how many weeks will {n} have exactly enough?",
    )
    need = b.eq("Still needed: {eq} dollars.", f"{goal} - {have}")
    b.eq("That takes {eq} weeks.", f"{need} / {weekly}")
    return q


TEMPLATES: dict[str, Callable[[random.Random, _Builder], str]] = {
    "shopping": _shopping,
    "rates": _rates,
    "fractions": _fractions,
    "ages": _ages,
    "wages": _wages,
    "discount": _discount,
    "baking": _baking,
    "garden": _garden,
    "reading": _reading,
    "sharing": _sharing,
    "comparison": _comparison,
    "ribbon": _ribbon,
    "savings": _savings,
}


def make_problem(seed: int) -> Problem:
    """The problem for `seed`; the same seed always gives the same problem."""
    r = random.Random(seed)
    name = sorted(TEMPLATES)[r.randrange(len(TEMPLATES))]
    b = _Builder()
    question = TEMPLATES[name](r, b)
    return Problem(seed, name, question, tuple(b.steps), b.steps[-1].value)


def problems(start: int, count: int) -> list[Problem]:
    return [make_problem(s) for s in range(start, start + count)]
