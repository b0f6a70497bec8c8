"""Write the self-written instruction prompts that the demo conversion distils its base on.

The AR base answers these prompts itself (`data --source ...,kind=distill`), so the converted model learns
to denoise the base's own behaviour; no outside corpus and no benchmark text is involved. The prompts are
combinations of the templates and word lists below, shuffled with a fixed seed: the same file (and so the
same sha256, recorded in the data manifest) on every machine. They deliberately avoid the probe families
of `evaluate-probes` (arithmetic, comparisons, sequences, copying, letter counts, multiple choice), so the
probes measure what the conversion kept, not what it was drilled on.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from pathlib import Path

TOPICS = """the ocean, volcanoes, honey bees, the moon, rainforests, trains, bicycles, coffee, tea, bread,
chess, music, painting, libraries, gardens, winter, summer, friendship, kindness, the internet, computers,
robots, electricity, magnets, rainbows, clouds, mountains, deserts, rivers, forests, birds, dolphins,
elephants, cats, dogs, owls, butterflies, the sun, stars, planets, airplanes, ships, cities, villages,
markets, recipes, soup, apples, oranges, chocolate, sleep, exercise, walking, swimming, reading, writing,
letters, photography, cameras, clocks, calendars, maps, bridges, castles, museums, schools, teachers,
doctors, firefighters, farmers, bakers, fishing, camping, picnics, holidays, birthdays, snow, rain, wind,
thunderstorms, the seasons, recycling, plants, trees, flowers, seeds, insects, ants, spiders, the brain,
the heart, water, fire, glass, paper, wood, stone, salt, sugar""".replace("\n", " ").split(", ")

WRITING = [
    "Write a short poem about {t}.",
    "Write two sentences about {t}.",
    "Write a short story about {t} for a child.",
    "Describe {t} in a few sentences.",
    "Write a haiku about {t}.",
    "Write a friendly note inviting a friend to learn about {t}.",
    "Give me a fun fact about {t}.",
    "Write a short paragraph explaining why people like {t}.",
]
EXPLAIN = [
    "Explain {t} to a ten-year-old.",
    "What is special about {t}?",
    "Tell me something interesting about {t}.",
    "Why are {t} important?",
    "How would you describe {t} to someone who has never seen them?",
    "What are some common questions people ask about {t}?",
]
LISTS = [
    "List three things related to {t}.",
    "Give three tips for someone interested in {t}.",
    "Name a few words that describe {t}.",
    "Give me three questions I could ask about {t}.",
]
PAIRS = [
    "What is the difference between {t} and {u}?",
    "Write one sentence that mentions both {t} and {u}.",
    "How are {t} and {u} alike?",
]
ADVICE = [
    "How can I get better at {a}?",
    "What should a beginner know about {a}?",
    "Give me a simple plan for {a} this week.",
    "What are good habits for {a}?",
]
ACTIVITIES = """cooking, drawing, running, learning a language, studying, saving money, gardening, playing the
piano, writing stories, taking photos, making friends, speaking in public, keeping a diary, cleaning a room,
planning a trip, learning to code, baking bread, reading more books, sleeping well, staying calm""".replace(
    "\n", " "
).split(", ")
REWRITE = [
    "Rewrite this sentence to sound more polite: '{s}'",
    "Make this sentence shorter: '{s}'",
    "Rewrite this sentence in the past tense: '{s}'",
    "Turn this sentence into a question: '{s}'",
]
SENTENCES = [
    "Give me the book on the table.",
    "I am going to the market to buy some bread.",
    "The weather is nice so we walk to the park.",
    "Close the window because it is cold.",
    "We are planning a picnic by the river.",
    "She plays the guitar every evening.",
    "The train leaves at eight in the morning.",
    "He writes a letter to his grandmother.",
    "They plant tomatoes in the garden.",
    "The children read stories before bed.",
]


def all_prompts() -> list[str]:
    out: list[str] = []
    for template in WRITING + EXPLAIN + LISTS:
        out += [template.format(t=t) for t in TOPICS]
    for template in PAIRS:
        out += [template.format(t=t, u=u) for t, u in itertools.combinations(TOPICS[:40], 2)]
    for template in ADVICE:
        out += [template.format(a=a) for a in ACTIVITIES]
    for template in REWRITE:
        out += [template.format(s=s) for s in SENTENCES]
    return sorted(set(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSONL file to write ({\"prompt\": ...} per line)")
    parser.add_argument("--count", type=int, default=6000, help="how many prompts to keep after shuffling")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    prompts = all_prompts()
    random.Random(args.seed).shuffle(prompts)
    prompts = prompts[: args.count]
    with open(Path(args.out), "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}, ensure_ascii=False) + "\n")
    print(f"wrote {len(prompts)} prompts to {args.out}")


if __name__ == "__main__":
    main()
