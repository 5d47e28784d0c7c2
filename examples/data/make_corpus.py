"""Regenerate ``corpus.txt``: short children's stories from a small hand-written grammar
(deterministic, seed 7), interleaved with a few public-domain passages written out below
(US Declaration of Independence preamble, the Gettysburg Address, Shakespeare's sonnets 18 and
116, the opening of Dickens's *A Tale of Two Cities*). Everything here is public domain or
written for aios; nothing is downloaded.

    python examples/data/make_corpus.py            # writes examples/data/corpus.txt (~400 KB)
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

PASSAGES = [
    """When in the Course of human events, it becomes necessary for one people to dissolve the political bands which have connected them with another, and to assume among the powers of the earth, the separate and equal station to which the Laws of Nature and of Nature's God entitle them, a decent respect to the opinions of mankind requires that they should declare the causes which impel them to the separation.
We hold these truths to be self-evident, that all men are created equal, that they are endowed by their Creator with certain unalienable Rights, that among these are Life, Liberty and the pursuit of Happiness.""",  # noqa: E501 (public-domain text kept verbatim, one paragraph per line)
    """Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in Liberty, and dedicated to the proposition that all men are created equal.
Now we are engaged in a great civil war, testing whether that nation, or any nation so conceived and so dedicated, can long endure. We are met on a great battle-field of that war. We have come to dedicate a portion of that field, as a final resting place for those who here gave their lives that that nation might live. It is altogether fitting and proper that we should do this.
But, in a larger sense, we can not dedicate -- we can not consecrate -- we can not hallow -- this ground. The brave men, living and dead, who struggled here, have consecrated it, far above our poor power to add or detract. The world will little note, nor long remember what we say here, but it can never forget what they did here. It is for us the living, rather, to be dedicated here to the unfinished work which they who fought here have thus far so nobly advanced. It is rather for us to be here dedicated to the great task remaining before us -- that from these honored dead we take increased devotion to that cause for which they gave the last full measure of devotion -- that we here highly resolve that these dead shall not have died in vain -- that this nation, under God, shall have a new birth of freedom -- and that government of the people, by the people, for the people, shall not perish from the earth.""",  # noqa: E501 (verbatim public-domain text)
    """Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date;
Sometime too hot the eye of heaven shines,
And often is his gold complexion dimm'd;
And every fair from fair sometime declines,
By chance or nature's changing course untrimm'd;
But thy eternal summer shall not fade,
Nor lose possession of that fair thou ow'st;
Nor shall death brag thou wander'st in his shade,
When in eternal lines to time thou grow'st:
So long as men can breathe or eyes can see,
So long lives this, and this gives life to thee.""",
    """Let me not to the marriage of true minds
Admit impediments. Love is not love
Which alters when it alteration finds,
Or bends with the remover to remove.
O no! it is an ever-fixed mark
That looks on tempests and is never shaken;
It is the star to every wandering bark,
Whose worth's unknown, although his height be taken.
Love's not Time's fool, though rosy lips and cheeks
Within his bending sickle's compass come;
Love alters not with his brief hours and weeks,
But bears it out even to the edge of doom.
If this be error and upon me proved,
I never writ, nor no man ever loved.""",
    """It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had everything before us, we had nothing before us, we were all going direct to Heaven, we were all going direct the other way.""",  # noqa: E501 (verbatim public-domain text)
]

NAMES = [
    "Lily",
    "Tom",
    "Anna",
    "Ben",
    "Mia",
    "Sam",
    "Lucy",
    "Max",
    "Ella",
    "Jack",
    "Rosa",
    "Finn",
    "Nora",
    "Leo",
    "Ivy",
    "Owen",
]
ANIMALS = [
    "cat",
    "dog",
    "bird",
    "rabbit",
    "fox",
    "bear",
    "duck",
    "frog",
    "mouse",
    "horse",
    "owl",
    "turtle",
]
THINGS = [
    "ball",
    "kite",
    "box",
    "book",
    "hat",
    "boat",
    "cake",
    "drum",
    "lamp",
    "key",
    "map",
    "shell",
    "stone",
    "flower",
    "apple",
    "cup",
]
PLACES = [
    "the park",
    "the garden",
    "the forest",
    "the beach",
    "the river",
    "the hill",
    "the farm",
    "the market",
    "the old house",
    "the school",
    "the lake",
    "the town",
]
ADJ = [
    "big",
    "small",
    "red",
    "blue",
    "green",
    "shiny",
    "old",
    "new",
    "soft",
    "funny",
    "quiet",
    "happy",
    "sad",
    "bright",
    "tiny",
    "yellow",
]
FEEL = [
    "happy",
    "sad",
    "scared",
    "excited",
    "tired",
    "proud",
    "surprised",
    "angry",
    "calm",
    "curious",
]
VERB_PAST = [
    "found",
    "saw",
    "wanted",
    "lost",
    "made",
    "shared",
    "painted",
    "carried",
    "hid",
    "picked up",
    "dropped",
    "fixed",
]
WEATHER = ["sunny", "rainy", "windy", "cold", "warm", "cloudy", "snowy", "bright"]
TIME = [
    "One day",
    "One morning",
    "Once upon a time",
    "Later that day",
    "The next day",
    "In the evening",
    "Long ago",
    "One summer",
]


def pick(rng: random.Random, xs: list[str]) -> str:
    return xs[rng.randrange(len(xs))]


def story(rng: random.Random) -> str:
    a, b = rng.sample(NAMES, 2)
    animal, thing, place = pick(rng, ANIMALS), pick(rng, THINGS), pick(rng, PLACES)
    adj, adj2, feel, feel2 = pick(rng, ADJ), pick(rng, ADJ), pick(rng, FEEL), pick(rng, FEEL)
    s = [f"{pick(rng, TIME)}, {a} went to {place}. It was a {pick(rng, WEATHER)} day."]
    s.append(f"{a} {pick(rng, VERB_PAST)} a {adj} {thing} near a {adj2} {animal}.")
    if rng.random() < 0.6:
        s.append(f'"Look at this {thing}!" said {a}. "Can I keep it?"')
        s.append(f'The {animal} looked at {a} and said, "Only if you share it with {b}."')
    s.append(f"{a} felt {feel}. {a} ran to find {b}.")
    if rng.random() < 0.5:
        s.append(f"{b} was at {pick(rng, PLACES)} with a {pick(rng, ADJ)} {pick(rng, THINGS)}.")
    s.append(f'"{b}, do you want to play with my {thing}?" asked {a}.')
    if rng.random() < 0.7:
        s.append(
            f'"Yes, please!" said {b}. They played with the {thing} all day, and {b} was {feel2}.'
        )
    else:
        s.append(
            f'"No, thank you," said {b}. "I have to help my mom." {a} was {feel2}, but {a} understood.'
        )
    if rng.random() < 0.5:
        n = rng.randint(2, 9)
        s.append(
            f"Then they counted {n} {pick(rng, THINGS)}s and {n + rng.randint(1, 5)} "
            f"{pick(rng, ANIMALS)}s on the way home."
        )
    s.append(f"At the end of the day, {a} and {b} said goodbye to the {animal}. The end.")
    return " ".join(s)


def build(target_bytes: int = 400_000, seed: int = 7) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    i = 0
    while size < target_bytes:
        if i % 60 == 59:
            parts.append(PASSAGES[(i // 60) % len(PASSAGES)])
        else:
            parts.append(story(rng))
        size += len(parts[-1]) + 2
        i += 1
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("corpus.txt")
    out.write_text(build())
    print(f"wrote {out} ({out.stat().st_size} bytes)")
