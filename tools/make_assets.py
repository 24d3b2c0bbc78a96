"""Write qa-train's offline demo assets: a small invented SQuAD v1.1 set and a tiny BERT.

Every passage is generated here from the templates below: invented towns, rivers, people
and ships with syllable names, so nothing is copied from SQuAD or Wikipedia. Train and dev
draw from one pool of unique names, so dev articles are about entities the model never saw.

    python tools/make_assets.py [OUT_DIR]    # default: qa_train/assets in this checkout

writes OUT_DIR/demo/{train,dev}.json and OUT_DIR/tiny-bert/ (config + WordPiece tokenizer
trained on the generated text). The JSON is byte-for-byte deterministic for a given seed; the
WordPiece trainer breaks ties in hash order, so a rerun may renumber a few vocab entries.
A development tool: it lives outside the package so it never ships in the wheel.
"""

from __future__ import annotations

import json
import random
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

SEED = 1234
N_TRAIN_ARTICLES = 300  # ~5 questions each -> ~1,500 questions
N_DEV_ARTICLES = 50  # ~250 questions
QUESTIONS_PER_PARAGRAPH = 5
FACTS_PER_PARAGRAPH = (4, 6)  # fact sentences besides the intro: ~75 words, ~100 wordpieces
FILLERS_PER_PARAGRAPH = (0, 1, 1, 2)  # distractor sentences, drawn from this tuple
VOCAB_SIZE = 4096  # before multi-digit pieces are dropped (see build_tokenizer): ~3,700 after
# The bundled copy that tests/unit/test_assets.py compares against; found from this file, not the
# working directory, so the tool works when run from anywhere in the checkout.
DEFAULT_OUT_DIR = Path(__file__).resolve().parents[1] / "qa_train" / "assets"

# One block per kind of article. `slots:` says how to invent each fact; an `intro:` or `fact:`
# line is one sentence, its alternative wordings separated by " | "; `ask SLOT:` lists question
# phrasings, some paraphrasing the sentence rather than copying it. Slot types: place, person,
# river, year, after:SLOT:LO-HI (a year LO-HI years later), num:LO-HI[:unit], pick:LIST, work.
TEMPLATES = """
== bridge: {name} Bridge
slots: name=place river=river town=place engineer=person patron=person built=year restored=after:built:15-120 length=num:80-900:metres arches=num:3-14 tolls=after:restored:5-60
intro: The {name} Bridge is a stone bridge that carries the old road across the {river} at {town}. | Spanning the {river} just outside {town}, the {name} Bridge is one of the oldest crossings in the region.
fact: It was designed by the engineer {engineer} and completed in {built}. | The engineer {engineer} drew up the plans, and the bridge opened to traffic in {built}.
fact: The cost of the work was met by the merchant {patron}. | Most of the money for the bridge came from {patron}, a wealthy wool trader.
fact: The bridge is {length} long and rests on {arches} arches. | Its {arches} arches carry a deck that is {length} long.
fact: After a flood damaged two of the piers, it was restored in {restored}. | A major restoration took place in {restored}, when the parapets were rebuilt.
fact: Tolls were collected from everyone who crossed it until {tolls}, when the town bought it. | Travellers paid a toll to cross the bridge until {tolls}.
ask river: Which river does the {name} Bridge cross? | What river is spanned by the {name} Bridge? | The {name} Bridge crosses which river?
ask town: At which town does the {name} Bridge cross the river? | Which town is the {name} Bridge near?
ask engineer: Who designed the {name} Bridge? | Which engineer planned the {name} Bridge? | Who drew up the plans for the {name} Bridge?
ask patron: Who paid for the {name} Bridge? | Which merchant funded the {name} Bridge?
ask built: When was the {name} Bridge completed? | In what year did the {name} Bridge open? | When was the {name} Bridge finished?
ask restored: When was the {name} Bridge restored? | In which year was the {name} Bridge repaired after the flood?
ask length: How long is the {name} Bridge? | What is the length of the {name} Bridge?
ask arches: How many arches does the {name} Bridge have? | On how many arches does the {name} Bridge rest?
ask tolls: Until when were tolls collected on the {name} Bridge? | When did the {name} Bridge stop charging a toll?

== town: {name}
slots: name=place river=river founded=year founder=person product=pick:products charter=after:founded:5-80 population=num:900-40000 mayor=person saint=place church=after:charter:10-90
intro: {name} is a quiet market town on the banks of the {river}, surrounded by low hills and farmland. | Lying on the {river}, {name} is a small town with narrow streets and a busy square.
fact: It was founded in {founded} by {founder}, a farmer from the hills. | According to local records, {founder} founded the settlement in {founded}.
fact: For centuries the wealth of the town came from {product}. | The main trade of {name} has long been {product}.
fact: The town received its charter in {charter}, which allowed a weekly market. | In {charter} {name} was granted a charter by the duke.
fact: Today it has a population of about {population}. | Around {population} people live in {name} today.
fact: The first mayor, {mayor}, built the town hall. | {mayor} served as the first mayor and paid for the town hall.
fact: The church in the main square is dedicated to Saint {saint} and dates from {church}. | Its oldest building is the church of Saint {saint}, built in {church}.
ask river: On which river does {name} lie? | Which river runs past {name}?
ask founded: When was {name} founded? | In what year was {name} established?
ask founder: Who founded {name}? | Who established the settlement of {name}?
ask product: What has the wealth of {name} come from? | What is the main trade of {name}?
ask charter: When did {name} receive its charter? | In what year was {name} granted a charter?
ask population: What is the population of {name}? | How many people live in {name}?
ask mayor: Who was the first mayor of {name}? | Who paid for the town hall of {name}?
ask saint: To which saint is the church in {name} dedicated? | Which saint is the church of {name} named after?
ask church: When was the church in {name} built? | What year does the church of {name} date from?

== river: {name} River
slots: name=place source=place sea=place length=num:40-900:kilometres towns=num:3-30 explorer=person mapped=year fish=pick:fish crossing=place
intro: The {name} River rises in the {source} Hills and flows into the {sea} Sea. | From its source in the {source} Hills, the {name} River runs down to the {sea} Sea.
fact: It is {length} long and is wide enough for barges along most of its course. | The river has a total length of {length}, measured from the hills to the coast.
fact: About {towns} towns stand along its banks. | Its banks are home to some {towns} towns and many villages.
fact: The explorer {explorer} was the first to map its whole course, in {mapped}. | Its full course was first mapped in {mapped} by {explorer}.
fact: Fishermen on the river are best known for catching {fish}. | The river is famous for its {fish}.
fact: The largest bridge over the river stands at {crossing}, where the valley is narrow. | At {crossing} the river is crossed by its largest bridge.
ask source: Where does the {name} River rise? | In which hills is the source of the {name} River?
ask sea: Into which sea does the {name} River flow? | Where does the {name} River end?
ask length: How long is the {name} River? | What is the length of the {name} River?
ask towns: How many towns stand along the {name} River? | How many towns are on the banks of the {name} River?
ask explorer: Who first mapped the {name} River? | Which explorer mapped the course of the {name} River?
ask mapped: When was the {name} River first mapped? | In what year was the course of the {name} River mapped?
ask fish: What fish is the {name} River known for? | What do fishermen catch in the {name} River?
ask crossing: Where is the largest bridge over the {name} River? | At which town is the {name} River crossed by its largest bridge?

== inventor: {name}
slots: name=person born=year town=place invention=pick:inventions made=after:born:22-50 teacher=person patents=num:2-60 died=after:made:5-35 workshop=place
intro: {name} was an inventor and clockmaker born in {town} in {born}, the son of a village blacksmith. | Born in {born} in the town of {town}, {name} became one of the best known inventors of the age.
fact: As a young man {short} learned the trade from {teacher}. | {short} was taught by the craftsman {teacher}.
fact: {short} built the first {invention} in {made}. | In {made} {short} showed the first {invention} to the public.
fact: Over a long career {short} was granted {patents} patents. | {short} eventually held {patents} patents.
fact: Later {short} opened a workshop in {workshop}, a busy port on the coast. | {short} moved to the port of {workshop} and set up a workshop there.
fact: {short} died in {died}. | The inventor died in {died} and was buried at {town}.
ask born: When was {name} born? | In what year was {name} born?
ask town: Where was {name} born? | In which town was {name} born?
ask teacher: Who taught {name}? | From whom did {name} learn the trade?
ask invention: What did {name} invent? | What device did {name} build first?
ask made: When did {name} build the first {invention}? | In what year did {name} show the first {invention}?
ask patents: How many patents did {name} hold? | How many patents was {name} granted?
ask died: When did {name} die? | In what year did {name} die?
ask workshop: Where did {name} open a workshop? | To which port did {name} move?

== ship: {name} (ship)
slots: name=place yard=place launched=year captain=person crew=num:40-400 masts=num:2-5 cargo=pick:cargo wrecked=after:launched:3-40 cost=num:1200-9000:crowns
intro: The {name} was a merchant ship built at the {yard} yard and launched in {launched}. | Launched in {launched} from the yard at {yard}, the {name} was a merchant ship.
fact: She carried a crew of {crew} and had {masts} masts, which made her fast in light winds. | With {masts} masts, she needed a crew of {crew} sailors.
fact: Her first captain was {captain}. | {captain} commanded her on her first voyage.
fact: She mostly carried {cargo} between the northern ports. | Her usual cargo was {cargo}.
fact: Building her cost the owners {cost}, a large sum at the time. | The owners paid {cost} for her construction.
fact: The {name} was wrecked on a reef in {wrecked}. | She was lost on a reef in a storm in {wrecked}.
ask yard: Where was the {name} built? | At which yard was the {name} built?
ask launched: When was the {name} launched? | In what year was the {name} launched?
ask crew: How many sailors did the {name} carry? | How large was the crew of the {name}?
ask masts: How many masts did the {name} have? | How many masts were on the {name}?
ask captain: Who was the first captain of the {name}? | Who commanded the {name} on her first voyage?
ask cargo: What did the {name} carry? | What was the usual cargo of the {name}?
ask wrecked: When was the {name} wrecked? | In what year was the {name} lost?
ask cost: How much did the {name} cost to build? | What did the owners pay for the {name}?

== festival: {name} Festival
slots: name=place town=place month=pick:months first=year founder=person theme=pick:themes visitors=num:2000-90000 days=num:2-12 ending=pick:endings
intro: The {name} Festival is held every year in {month} in the town of {town}, and it fills the streets with stalls. | Every {month}, the town of {town} hosts the {name} Festival, one of the oldest fairs in the region.
fact: It was first held in {first}, when {founder} organised a small fair. | {founder} started the festival in {first}.
fact: The festival celebrates {theme}, and families travel from far away to take part. | Its purpose is to celebrate {theme}.
fact: It lasts {days} days and draws about {visitors} visitors. | About {visitors} visitors come for its {days} days of music and food.
fact: On the last night the festival ends with {ending}. | The final event of the festival is always {ending}.
ask month: When is the {name} Festival held? | In which month does the {name} Festival take place?
ask town: Where is the {name} Festival held? | Which town hosts the {name} Festival?
ask first: When was the {name} Festival first held? | In what year did the {name} Festival start?
ask founder: Who started the {name} Festival? | Who organised the first {name} Festival?
ask theme: What does the {name} Festival celebrate? | What is the {name} Festival for?
ask days: How many days does the {name} Festival last? | How long does the {name} Festival last?
ask visitors: How many visitors does the {name} Festival draw? | How many people visit the {name} Festival?
ask ending: How does the {name} Festival end? | What is the final event of the {name} Festival?

== observatory: {name} Observatory
slots: name=place hill=place founded=year founder=person lens=num:20-120:centimetres height=num:300-2400:metres discovery=pick:discoveries found=after:founded:4-90 books=num:300-9000
intro: The {name} Observatory stands on {hill} Hill, {height} above the sea. | Built on top of {hill} Hill at a height of {height}, the {name} Observatory looks over the valley.
fact: It was founded in {founded} by the astronomer {founder}. | The astronomer {founder} opened it in {founded}.
fact: Its main telescope has a lens {lens} wide and sits under a copper dome. | The great telescope has a lens of {lens}.
fact: In {found} astronomers there discovered {discovery}. | The observatory is famous for the discovery of {discovery} in {found}.
fact: Its library holds about {books} books and star charts. | A library of some {books} books is kept in the east wing.
ask hill: On which hill does the {name} Observatory stand? | Where is the {name} Observatory?
ask height: How high above the sea is the {name} Observatory? | At what height is the {name} Observatory?
ask founded: When was the {name} Observatory founded? | In what year did the {name} Observatory open?
ask founder: Who founded the {name} Observatory? | Which astronomer opened the {name} Observatory?
ask lens: How wide is the lens of the {name} Observatory telescope? | What is the size of the lens at the {name} Observatory?
ask discovery: What was discovered at the {name} Observatory? | What is the {name} Observatory famous for discovering?
ask found: When was the discovery made at the {name} Observatory? | In what year did the {name} Observatory make its discovery?
ask books: How many books does the library of the {name} Observatory hold? | How many books are kept at the {name} Observatory?

== composer: {name}
slots: name=person born=year town=place instrument=pick:instruments teacher=person work=work symphonies=num:2-12 died=after:born:35-85 court=place
intro: {name} was a composer born in {born} in {town}, a small town known for its choirs. | The composer {name} was born in {town} in {born} and showed a gift for music at an early age.
fact: {short} first studied the {instrument} with {teacher}. | As a child {short} learned the {instrument} from {teacher}.
fact: The best known work by {short} is the {work}. | {short} is remembered above all for the {work}.
fact: In all {short} wrote {symphonies} symphonies. | {short} completed {symphonies} symphonies.
fact: {short} died in {died}. | The composer died in {died}, far from {town}.
fact: For many years {short} was director of music at the court of {court}. | {short} later served as director of music in the city of {court}.
ask born: When was {name} born? | In what year was {name} born?
ask town: Where was {name} born? | In which town was {name} born?
ask instrument: What instrument did {name} study? | Which instrument did {name} learn as a child?
ask teacher: Who taught {name}? | With whom did {name} study?
ask work: What is the best known work by {name}? | For which work is {name} remembered?
ask symphonies: How many symphonies did {name} write? | How many symphonies did {name} complete?
ask died: When did {name} die? | In what year did {name} die?
ask court: Where was {name} director of music? | In which city did {name} direct the music?

== guild: {name} Guild of {craft}
slots: name=place craft=pick:crafts founded=year town=place members=num:20-600 master=person hall=after:founded:6-70 saint=place fee=num:2-40:pennies
intro: The {name} Guild of {craft} was a trade guild based in the town of {town}. | Based in {town}, the {name} Guild of {craft} brought together the local craftsmen.
fact: It was founded in {founded}, when the craftsmen agreed to share their tools and fix their prices. | The guild was formed in {founded} after a long dispute over prices.
fact: At its height it had {members} members. | The guild counted some {members} members at its peak.
fact: Its first master was {master}. | {master} was chosen as the first master of the guild.
fact: The guild hall was completed in {hall}. | In {hall} the members finished building their hall.
fact: Each member paid {fee} a year, and the money cared for sick craftsmen. | Members paid a yearly fee of {fee} to the guild.
fact: The guild honoured Saint {saint} as its patron. | Its patron saint was Saint {saint}.
ask town: Where was the {name} Guild of {craft} based? | In which town was the {name} Guild of {craft}?
ask founded: When was the {name} Guild of {craft} founded? | In what year was the {name} Guild of {craft} formed?
ask members: How many members did the {name} Guild of {craft} have? | How many members did the {name} Guild of {craft} have at its peak?
ask master: Who was the first master of the {name} Guild of {craft}? | Who led the {name} Guild of {craft} first?
ask hall: When was the hall of the {name} Guild of {craft} completed? | In what year was the {name} Guild of {craft} hall finished?
ask fee: How much did members of the {name} Guild of {craft} pay each year? | What was the yearly fee of the {name} Guild of {craft}?
ask saint: Who was the patron saint of the {name} Guild of {craft}? | Which saint did the {name} Guild of {craft} honour?
"""

CHOICES = {
    key: words.split("|")
    for key, words in {
        "products": "wool|salt|glass|cheese|rope|paper|pottery|copper|leather|timber",
        "fish": "trout|eels|salmon|perch|pike|carp",
        "inventions": "tide clock|steam loom|brass compass|water pump|glass lantern|mechanical plough|rain gauge",
        "cargo": "salt and timber|wine|grain|coal|wool|spices|copper ore|olive oil",
        "months": "January|February|March|April|May|June|July|August|September|October|November|December",
        "themes": "the barley harvest|the return of the swallows|the first snow|the end of winter|the spring lambs"
        "|the grape harvest|the founding of the town",
        "endings": "a torch parade|a boat race|a bonfire on the hill|a dance in the square|a great feast",
        "discoveries": "a bright comet|a faint nebula|two small moons|a double star|a new planet",
        "instruments": "violin|organ|harp|cello|flute|piano|oboe",
        "crafts": "Weavers|Masons|Bakers|Coopers|Glaziers|Tanners|Dyers",
        "works": "Suite|Variations|Nocturnes|Mass|Overture|Serenade",
    }.items()
}
# Distractors: extra years, names and numbers the questions never ask about.
FILLERS = [
    "A small museum in {c} keeps {n} old maps of the district.",
    "Local records from {y} mention a great storm in the valley.",
    "The historian {p} later wrote a short account of the region.",
    "In {y} the roads of the district were improved by {p}.",
    "A stone marker placed in {y} still stands beside the road to {c}.",
    "In a letter, {p} counted {n} houses in the nearby villages.",
    "The region was known for its orchards long before {y}.",
    "A weekly coach linked the district with {c} from {y}.",
]
SYLLABLES = (
    "ba bel bri ca cor da del dor el fa fen gal gor ha hel is ka kel lan lor ma mar mel "
    "na nor o pel ra ren ri sa sel tal tor ul va vel wen yr za zen"
).split()
ENDINGS = ("a an ar by dale el en ford ia in ith mere mor on or ra ric ton us wick yn").split()
MAX_ANSWERS = 3
NUMBER_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
).split()


@dataclass
class Kind:
    name: str
    title: str
    slots: dict[str, str] = field(default_factory=dict)
    groups: list[list[str]] = field(default_factory=list)  # groups[0] is the intro
    asks: dict[str, list[str]] = field(default_factory=dict)


def parse_templates(text: str) -> list[Kind]:
    kinds: list[Kind] = []
    for line in (raw.strip() for raw in text.strip().splitlines()):
        if not line:
            continue
        if line.startswith("=="):
            name, title = line[2:].split(":", 1)
            kinds.append(Kind(name.strip(), title.strip()))
        elif line.startswith("slots:"):
            kinds[-1].slots = dict(item.split("=", 1) for item in line[6:].split())
        elif line.startswith(("intro:", "fact:")):
            kinds[-1].groups.append([v.strip() for v in line.split(":", 1)[1].split(" | ")])
        elif line.startswith("ask "):
            slot, questions = line[4:].split(":", 1)
            kinds[-1].asks[slot.strip()] = [q.strip() for q in questions.split(" | ")]
        else:
            raise ValueError(f"make_assets: cannot parse template line {line!r}")
    return kinds


class Namer:
    """Invents capitalised names from syllables; never hands out the same word twice."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def word(self) -> str:
        while True:
            parts = self.rng.choices(SYLLABLES, k=self.rng.choice((1, 2, 2)))
            w = "".join(parts + [self.rng.choice(ENDINGS)]).capitalize()
            if w not in self.used and 4 <= len(w) <= 11:
                self.used.add(w)
                return w

    def person(self) -> str:
        return f"{self.word()} {self.word()}"


def spell(n: int) -> str:
    """ "seven", "twenty", "143", "12,400": words up to twenty also keep counts apart from years."""
    return NUMBER_WORDS[n] if n < len(NUMBER_WORDS) else f"{n:,}"


def invent_slots(kind: Kind, namer: Namer, rng: random.Random) -> dict[str, str]:
    values: dict[str, str] = {}
    taken: set[str] = set()  # no two numeric facts in one paragraph share a value

    def fresh(make) -> str:
        while (v := make()) in taken:
            pass
        taken.add(v)
        return v

    for slot, spec in kind.slots.items():
        typ, _, arg = spec.partition(":")
        if typ == "place":
            values[slot] = namer.word()
        elif typ == "river":
            values[slot] = f"{namer.word()} River"
        elif typ == "person":
            values[slot] = namer.person()
        elif typ == "year":
            values[slot] = fresh(lambda: str(rng.randint(1620, 1860)))
        elif typ == "after":  # after:SLOT:LO-HI, a year LO to HI years after SLOT's
            base, lo, hi = re.fullmatch(r"(\w+):(\d+)-(\d+)", arg).groups()
            values[slot] = fresh(lambda base=base, lo=lo, hi=hi: str(int(values[base]) + rng.randint(int(lo), int(hi))))
        elif typ == "num":  # num:LO-HI[:unit]; small counts spelled out as in edited prose
            lo, hi, unit = re.fullmatch(r"(\d+)-(\d+):?(\w*)", arg).groups()
            n = fresh(lambda lo=lo, hi=hi: spell(rng.randint(int(lo), int(hi))))
            values[slot] = f"{n} {unit}" if unit else n
        elif typ == "pick":
            values[slot] = rng.choice(CHOICES[arg])
        elif typ == "work":
            values[slot] = f"{namer.word()} {rng.choice(CHOICES['works'])}"
        else:
            raise ValueError(f"make_assets: kind {kind.name}: unknown slot type {spec!r}")
    values["short"] = values["name"].split()[-1]  # surname, for the person kinds
    return values


def render(template: str, values: dict[str, str], start: int, spans: dict[str, int]) -> str:
    """Fill one sentence; record where each fact slot first lands in the paragraph."""
    out = []
    for i, piece in enumerate(re.split(r"\{(\w+)\}", template)):
        if i % 2 == 1:
            spans.setdefault(piece, start + sum(map(len, out)))
            piece = values[piece]
        out.append(piece)
    return "".join(out)


def filler(namer: Namer, rng: random.Random, values: dict[str, str]) -> str:
    used = {v.split()[0] for v in values.values()}  # "212 metres" -> "212"
    while (y := str(rng.randint(1620, 1900))) in used:
        pass
    while (n := str(rng.randint(11, 99))) in used:
        pass
    return rng.choice(FILLERS).format(y=y, n=n, p=namer.person(), c=namer.word())


def make_paragraph(
    kind: Kind, namer: Namer, rng: random.Random, fact_range: tuple[int, int] = FACTS_PER_PARAGRAPH
) -> tuple[str, dict, dict[str, int]]:
    """One paragraph: the intro, `fact_range` fact sentences in random order, fillers; where each slot lands."""
    values = invent_slots(kind, namer, rng)
    facts = kind.groups[1:]
    rng.shuffle(facts)
    sentences = [rng.choice(g) for g in facts[: rng.randint(*fact_range)]]
    for _ in range(rng.choice(FILLERS_PER_PARAGRAPH)):  # distractors anywhere after the intro
        sentences.insert(rng.randint(0, len(sentences)), filler(namer, rng, values))
    spans: dict[str, int] = {}
    parts: list[str] = []
    pos = 0
    for template in [rng.choice(kind.groups[0])] + sentences:
        parts.append(render(template, values, pos, spans))
        pos += len(parts[-1]) + 1
    return " ".join(parts), values, spans


def answer_variants(context: str, start: int, text: str) -> list[tuple[str, int]]:
    """Other spans a human annotator might have marked for the same answer."""
    out: list[tuple[str, int]] = []
    for prefix in ("the ", "in ", "about ", "some "):
        if context[max(0, start - len(prefix)) : start].lower() == prefix:
            out.append((context[start - len(prefix) : start + len(text)], start - len(prefix)))
    words = text.split()
    if words[0].replace(",", "").isdigit() or words[0] in NUMBER_WORDS:
        if len(words) == 2:
            out.append((words[0], start))  # "212 metres" -> "212"
        elif not re.fullmatch(r"1\d\d\d", text) and (m := re.match(r" [a-z]+s\b", context[start + len(text) :])):
            out.append((text + m.group(0), start))  # "seven" -> "seven arches", never "1843 by"
    elif words[0] in ("a", "the") and len(words) > 2:
        out.append((text[len(words[0]) + 1 :], start + len(words[0]) + 1))  # "the first snow" -> "first snow"
    elif len(words) == 2 and words[0][0].isupper():
        if words[1] == "River":
            out.append((words[0], start))  # "Oskel River" -> "Oskel"
        elif words[1] not in CHOICES["works"]:
            out.append((words[1], start + len(text) - len(words[1])))  # "Orin Tavel" -> "Tavel"
    return out


def make_article(kinds: list[Kind], namer: Namer, rng: random.Random, dev: bool) -> dict:
    kind = rng.choice(kinds)
    context, values, spans = make_paragraph(kind, namer, rng)
    asked = [s for s in kind.asks if s in spans]
    qas = []
    for slot in rng.sample(asked, min(QUESTIONS_PER_PARAGRAPH, len(asked))):
        start, text = spans[slot], values[slot]
        if context[start : start + len(text)] != text:
            raise AssertionError(f"make_assets: bad span for {slot!r} in {context!r}")
        answers = [(text, start)]
        if dev:  # like SQuAD dev: up to three annotators, sometimes marking a wider or narrower span
            extra = answer_variants(context, start, text)
            answers += rng.sample(extra, rng.randint(0, min(len(extra), MAX_ANSWERS - 1)))
        qas.append(
            {
                "id": f"{rng.getrandbits(96):024x}",
                "question": rng.choice(kind.asks[slot]).format(**values),
                "answers": [{"text": t, "answer_start": s} for t, s in answers],
            }
        )
    title = kind.title.format(**values).replace(" ", "_")
    return {"title": title, "paragraphs": [{"context": context, "qas": qas}]}


def make_datasets(seed: int = SEED) -> tuple[dict, dict]:
    rng = random.Random(seed)
    kinds = parse_templates(TEMPLATES)
    namer = Namer(rng)  # shared, so every dev entity differs from every train entity
    train = [make_article(kinds, namer, rng, dev=False) for _ in range(N_TRAIN_ARTICLES)]
    dev = [make_article(kinds, namer, rng, dev=True) for _ in range(N_DEV_ARTICLES)]
    return {"version": "1.1", "data": train}, {"version": "1.1", "data": dev}


def filler_corpus(rng: random.Random, n: int = 3000) -> list[str]:
    """Plain sentences so the vocab also knows everyday words our templates do not use."""
    parts = [
        p.split("|")
        for p in (
            "the old miller|a young sailor|the town council|her brother|the farmers|a travelling painter|the priest",
            "visited|repaired|painted|described|sold|carried|watched|opened|closed|measured|crossed|bought|found",
            "the harbour|a wooden boat|the north gate|the mill|an iron bell|the orchard|a long letter|the tower",
            "in the spring|after the war|during the winter|before dawn|every summer|for many years|with great care",
        )
    ]
    return [" ".join(rng.choice(p) for p in parts).capitalize() + "." for _ in range(n)]


def corpus(datasets: list[dict], rng: random.Random) -> list[str]:
    texts = filler_corpus(rng)
    for ds in datasets:
        for article in ds["data"]:
            for para in article["paragraphs"]:
                texts.append(para["context"])
                texts.extend(qa["question"] for qa in para["qas"])
    return texts


def build_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # [PAD] must be id 0 for BERT
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(
        texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    )
    # Numbers go digit by digit, "1843" -> 1 ##8 ##4 ##3: twenty well-trained tokens instead of
    # hundreds of rare number pieces, and "##" tells where a number starts. A from-scratch tiny
    # BERT found number answers far more often this way than with plain WordPiece number pieces.
    vocab = tok.get_vocab()
    keep = [t for t in sorted(vocab, key=vocab.get) if not any(c.isdigit() for c in t)]
    keep += [str(d) for d in range(10)] + [f"##{d}" for d in range(10)]
    tok.model = models.WordPiece({t: i for i, t in enumerate(keep)}, unk_token="[UNK]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", keep.index("[CLS]")), ("[SEP]", keep.index("[SEP]"))],
    )
    return tok


def write_tiny_bert(out: Path, texts: list[str], sample: tuple[str, str]) -> int:
    from transformers import AutoConfig, AutoTokenizer, BertConfig, BertTokenizerFast

    tok = build_tokenizer(texts)
    # Wrap the trained object: BertTokenizerFast(vocab_file=...) silently builds a 5-token vocab
    # under transformers 5.x.
    BertTokenizerFast(tokenizer_object=tok, do_lower_case=True, model_max_length=512).save_pretrained(out)
    vocab = tok.get_vocab()
    (out / "vocab.txt").write_text("".join(f"{t}\n" for t in sorted(vocab, key=vocab.get)), encoding="utf-8")
    # Trained from scratch for a few hundred steps, BERT's 0.02 init sits on a plateau where no
    # context token looks at the question (dev EM ~5 after 6 epochs); 0.1 leaves it within ~2
    # epochs. Dropout only slowed such short runs down.
    BertConfig(
        vocab_size=len(vocab),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=512,
        max_position_embeddings=512,
        initializer_range=0.1,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    ).save_pretrained(out)

    reloaded, config = AutoTokenizer.from_pretrained(out), AutoConfig.from_pretrained(out)
    question, context = sample
    enc = reloaded(
        question,
        context,
        truncation="only_second",
        max_length=64,
        stride=16,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    problems = [
        f"fast={reloaded.is_fast}" if not reloaded.is_fast else "",
        f"len {len(reloaded)}, config {config.vocab_size}, vocab {len(vocab)}"
        if not len(reloaded) == config.vocab_size == len(vocab)
        else "",
        f"[UNK] in {reloaded.tokenize(context)}" if reloaded.unk_token_id in reloaded(context)["input_ids"] else "",
        "no overflowing windows" if len(enc["input_ids"]) < 2 or "offset_mapping" not in enc else "",
    ]
    if any(problems):
        raise AssertionError(f"{out}: reloaded tokenizer is wrong: {'; '.join(p for p in problems if p)}")
    return len(vocab)


def write_assets(out_dir: Path, seed: int = SEED, tokenizer: bool = True) -> dict[str, int]:
    """(Re)write demo/{train,dev}.json and, unless tokenizer=False, tiny-bert/ under out_dir."""
    out_dir = Path(out_dir)
    train, dev = make_datasets(seed)
    (out_dir / "demo").mkdir(parents=True, exist_ok=True)
    for name, ds in (("train", train), ("dev", dev)):
        text = json.dumps(ds, ensure_ascii=False, indent=None, separators=(",", ":"))
        (out_dir / "demo" / f"{name}.json").write_text(text + "\n", encoding="utf-8")
    stats = {
        f"{n}_questions": sum(len(p["qas"]) for a in ds["data"] for p in a["paragraphs"])
        for n, ds in (("train", train), ("dev", dev))
    }
    if tokenizer:
        (out_dir / "tiny-bert").mkdir(parents=True, exist_ok=True)
        para = max((p for a in dev["data"] for p in a["paragraphs"]), key=lambda p: len(p["context"]))
        sample = (para["qas"][0]["question"], para["context"])
        stats["vocab_size"] = write_tiny_bert(out_dir / "tiny-bert", corpus([train, dev], random.Random(seed)), sample)
    return stats


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    out_dir = Path(argv[0]) if argv else DEFAULT_OUT_DIR
    print(json.dumps(write_assets(out_dir)))


if __name__ == "__main__":
    main()
