"""Write the self-written instruction prompts that the demo conversion distils its base on.

The AR base answers these prompts itself (`data --source ...,kind=distill`), so the converted model learns
to denoise the base's own behaviour; no outside corpus and no benchmark text (no test or validation split
of anything) is involved: every prompt is a combination of the templates and word lists in this file.
They deliberately avoid the probe families of `evaluate-probes` (arithmetic, comparisons of numbers,
sequences, copying, letter counts, multiple choice), so the probes measure what the conversion kept, not
what it was drilled on; `probe_like` names the patterns, and the tests check that none is produced.

Categories (writing, explaining, lists, pairs, advice, how-to, rewriting, role play, dialogue,
hypotheticals, word meanings, messages) each expand to every combination of their templates and
fillers, some with a style or audience added. `--count N` draws a stratified sample: each category's
pool is shuffled with its own seed and categories contribute in proportion to their weights (a small
category gives all it has and the rest is shared by the others), then the whole list is shuffled. The same
`--seed` and `--count` give the same file (and so the same sha256 in the data manifest) on every machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
from pathlib import Path


def words(text: str) -> list[str]:
    return [w.strip() for w in text.replace("\n", " ").split(",") if w.strip()]


TOPICS = words("""the ocean, volcanoes, honey bees, the moon, rainforests, trains, bicycles, coffee, tea, bread,
chess, music, painting, libraries, gardens, winter, summer, friendship, kindness, the internet, computers,
robots, electricity, magnets, rainbows, clouds, mountains, deserts, rivers, forests, birds, dolphins,
elephants, cats, dogs, owls, butterflies, the sun, stars, planets, airplanes, ships, cities, villages,
markets, recipes, soup, apples, oranges, chocolate, sleep, exercise, walking, swimming, reading, writing,
letters, photography, cameras, clocks, calendars, maps, bridges, castles, museums, schools, teachers,
doctors, firefighters, farmers, bakers, fishing, camping, picnics, holidays, birthdays, snow, rain, wind,
thunderstorms, the seasons, recycling, plants, trees, flowers, seeds, insects, ants, spiders, the brain,
the heart, water, fire, glass, paper, wood, stone, salt, sugar, penguins, whales, sharks, frogs, turtles,
horses, cows, sheep, rabbits, foxes, wolves, bears, lions, tigers, giraffes, zebras, monkeys, parrots,
eagles, bats, snails, jellyfish, octopuses, coral reefs, islands, lakes, waterfalls, caves, glaciers,
earthquakes, tides, fog, sunsets, autumn leaves, spring, the night sky, comets, telescopes, microscopes,
batteries, light bulbs, radios, televisions, telephones, smartphones, email, video games, board games,
puzzles, kites, balloons, trains stations, airports, harbors, lighthouses, windmills, solar panels,
wind turbines, cars, buses, trucks, motorcycles, subways, rockets, satellites, space stations, astronauts,
pilots, sailors, nurses, scientists, engineers, artists, musicians, writers, librarians, chefs, gardeners,
carpenters, plumbers, mail carriers, shopkeepers, police officers, judges, inventors, explorers,
grandparents, neighbors, siblings, pets, hobbies, homework, exams, summer camp, playgrounds, parks, zoos,
aquariums, farms, orchards, vineyards, bakeries, restaurants, cafes, supermarkets, bookshops, theaters,
cinemas, concerts, festivals, parades, fireworks, weddings, sports, football, basketball, tennis,
running, cycling, skiing, skating, dancing, singing, drums, guitars, pianos, violins, poetry, fairy tales,
myths, dinosaurs, fossils, pyramids, ancient Rome, the Middle Ages, knights, pirates, maps of old,
languages, alphabets, handwriting, newspapers, magazines, radio shows, podcasts, cartoons, comics,
cooking, baking, rice, pasta, cheese, milk, eggs, honey, vegetables, potatoes, carrots, tomatoes,
strawberries, bananas, lemons, ice cream, pizza, sandwiches, breakfast, lunch, dinner, tea parties,
umbrellas, shoes, hats, scarves, sweaters, buttons, zippers, mirrors, candles, lamps, chairs, tables,
beds, pillows, blankets, windows, doors, keys, locks, stairs, elevators, roofs, chimneys, fences,
wells, tents, boats, canoes, sailing, hiking, climbing, gardening tools, compost, bees and flowers,
weather forecasts, thermometers, ice, steam, bubbles, soap, toothbrushes, haircuts, laughter, smiles,
patience, courage, honesty, curiosity, gratitude, teamwork, sharing, saving money, budgets, shopping
lists, to-do lists, habits, mornings, evenings, weekends, vacations, road trips, postcards, souvenirs""")

PAIR_TOPICS = words("""cats, dogs, tea, coffee, trains, airplanes, books, movies, winter, summer, the sun, the moon,
rivers, lakes, bicycles, cars, cities, villages, mountains, beaches, rain, snow, owls, eagles, apples,
oranges, bread, rice, paper, plastic, wood, stone, letters, emails, radios, televisions, piano, guitar,
chess, football, forests, deserts, frogs, turtles, bees, butterflies, breakfast, dinner, mornings,
evenings, walking, running, museums, libraries, maps, compasses, candles, lamps, boats, submarines,
castles, palaces, farmers, chefs, doctors, nurses, painting, photography, poems, stories, stars,
planets, clouds, fog, wolves, foxes, whales, dolphins, gardens, parks""")

ACTIVITIES = words("""cooking, drawing, running, learning a language, studying, saving money, gardening, playing the
piano, writing stories, taking photos, making friends, speaking in public, keeping a diary, cleaning a room,
planning a trip, learning to code, baking bread, reading more books, sleeping well, staying calm, swimming,
playing chess, singing, dancing, knitting, painting with watercolors, playing the guitar, juggling,
riding a bike, hiking, camping, fishing, bird watching, growing tomatoes, caring for a cat, training a
puppy, keeping plants alive, cooking rice, making soup, organizing a desk, packing a suitcase, getting up
early, drinking more water, eating more vegetables, walking every day, stretching, meditating, listening
to others, remembering names, writing letters, learning to type, managing time, doing homework, preparing
for a job interview, working from home, working in a team, giving feedback, asking for help, saying no
politely, making a budget, shopping on a budget, reducing waste, recycling at home, fixing a flat tire,
sewing a button, making a birthday card, hosting a dinner, telling jokes, writing poems""")

TASKS = words("""make a cup of tea, boil an egg, plant a seed, tie a shoelace, wash dishes by hand, make a paper
airplane, fold a shirt, set a table for dinner, make a sandwich, water a houseplant, clean a window, make
a bed, wrap a present, write a thank-you note, pack a school bag, make lemonade, start a vegetable garden,
brush a dog, build a snowman, fly a kite, make a simple salad, cook pasta, make pancakes, bake cookies,
toast bread, peel an orange, make a smoothie, light a campfire safely, pitch a tent, read a map, use a
compass, change a light bulb, hang a picture, paint a wall, organize a bookshelf, clean a bicycle chain,
pump up a bicycle tire, make a to-do list, plan a picnic, write a short poem, start a journal, learn a new
word every day, practice handwriting, memorize a short poem, prepare for a long walk, pack for a weekend
trip, make a bird feeder, care for a goldfish, keep a room tidy, sort laundry, iron a shirt, sew a patch,
make a photo album, send a postcard, make friends at a new school, welcome a new neighbor, calm down
before a test, fall asleep faster, wake up on time, stretch after a run""")

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
    "The cat sleeps on the warm windowsill.",
    "My brother fixes his bicycle in the garage.",
    "We watch the stars from the roof.",
    "The baker opens the shop very early.",
    "I forgot my umbrella at the office.",
    "The river flows slowly through the valley.",
    "Our teacher tells funny stories in class.",
    "The dog runs across the field after the ball.",
    "She paints the old fence a bright blue.",
    "The museum closes at five on Sundays.",
    "He makes soup with carrots and onions.",
    "The wind blows the leaves across the street.",
    "I need to finish my homework tonight.",
    "The library has a new section for children.",
    "We hear the birds singing in the morning.",
    "The bus is late again today.",
    "My grandmother knits warm scarves for everyone.",
    "The farmer feeds the chickens before breakfast.",
    "They are building a new bridge over the river.",
    "The lights in the city shine all night.",
    "Send me a message when you arrive.",
    "The soup is too hot to eat right now.",
    "Our team practices every Tuesday afternoon.",
    "The snow covers the mountains in winter.",
    "I like to read in the garden on Sundays.",
    "The owl hoots from the tall oak tree.",
    "Please turn off the lights when you leave.",
    "The new cafe serves very good coffee.",
    "He lost his keys somewhere in the house.",
    "The children build a sandcastle on the beach.",
]
REWRITES = [
    "Rewrite this sentence to sound more polite: '{s}'",
    "Make this sentence shorter: '{s}'",
    "Rewrite this sentence in the past tense: '{s}'",
    "Turn this sentence into a question: '{s}'",
    "Rewrite this sentence in a more formal style: '{s}'",
    "Rewrite this sentence so it sounds more exciting: '{s}'",
    "Expand this sentence into a short paragraph: '{s}'",
    "Rewrite this sentence in the future tense: '{s}'",
    "Write a sentence that could come right after this one: '{s}'",
    "Explain what this sentence means in simple words: '{s}'",
    "Rewrite this sentence from the point of view of an animal: '{s}'",
    "Start a short story with this sentence: '{s}'",
]

WRITING = [
    "Write a short poem about {t}.",
    "Write two sentences about {t}.",
    "Write a short story about {t} for a child.",
    "Describe {t} in a few sentences.",
    "Write a haiku about {t}.",
    "Write a friendly note inviting a friend to learn about {t}.",
    "Give me a fun fact about {t}.",
    "Write a short paragraph explaining why people like {t}.",
    "Write a four-line rhyme about {t}.",
    "Write a diary entry about a day spent with {t}.",
    "Write a short song verse about {t}.",
    "Write a catchy slogan about {t}.",
    "Write the opening sentence of a mystery story involving {t}.",
    "Write a short bedtime story that includes {t}.",
    "Describe {t} using all five senses.",
    "Write a short riddle whose answer is {t}.",
    "Write a thank-you note to {t}.",
    "Write a short advertisement for a book about {t}.",
]
EXPLAIN = [
    "Explain {t} to a ten-year-old.",
    "What is special about {t}?",
    "Tell me something interesting about {t}.",
    "Why do people care about {t}?",
    "How would you describe {t} to a visitor from another planet?",
    "What are some common questions people ask about {t}?",
    "What do most people not know about {t}?",
    "What has changed about {t} over time?",
    "What are the good and bad sides of {t}?",
    "Why do people find {t} interesting?",
    "What is a common mistake people believe about {t}?",
    "How can someone learn more about {t}?",
    "What would the world be like without {t}?",
    "Summarize what you know about {t} in a short paragraph.",
]
LISTS = [
    "List three things related to {t}.",
    "Give three tips for someone interested in {t}.",
    "Name a few words that describe {t}.",
    "Give me three questions I could ask about {t}.",
    "In what ways do people come across {t} in everyday life?",
    "Give me a few ideas for a school project about {t}.",
    "Suggest three titles for a story about {t}.",
    "List a few feelings people might have about {t}.",
]
PAIRS = [
    "What is the difference between {t} and {u}?",
    "Write one sentence that mentions both {t} and {u}.",
    "How are {t} and {u} alike?",
    "Write a short story that includes both {t} and {u}.",
    "Which would you rather learn about, {t} or {u}, and why?",
    "Write a short poem about {t} and {u}.",
]
ADVICE = [
    "How can I get better at {a}?",
    "What should a beginner know about {a}?",
    "Give me a simple plan for {a} this week.",
    "What are good habits for {a}?",
    "What are common mistakes when {a}?",
    "How do I stay motivated with {a}?",
    "Why is {a} worth trying?",
    "What do I need to get started with {a}?",
    "Give me one small step I can take today toward {a}.",
    "How can a family enjoy {a} together?",
]
HOWTO = [
    "How do I {x}?",
    "Explain step by step how to {x}.",
    "What is the easiest way to {x}?",
    "Write simple instructions for a child on how to {x}.",
    "What can go wrong when you {x}, and how do you avoid it?",
    "Give me three tips to {x} well.",
]
ROLES = words("""a tour guide, a museum guide, a park ranger, a friendly librarian, a chef, a sports coach, a
lighthouse keeper, a ship captain, a zookeeper, a gardener, a music teacher, a baker, a pilot, a train
conductor, a weather reporter, a detective, a wizard in a story, a dragon who loves books, a talking cat,
a robot helper, a kind grandparent, an astronaut, a shopkeeper, a mail carrier, a camp counselor""")
ROLE_TASKS = [
    "You are {r}. Introduce yourself in a few sentences.",
    "You are {r}. Describe a normal day at work.",
    "You are {r}. Give a short welcome speech to a group of visitors.",
    "You are {r}. Share your best piece of advice.",
    "You are {r}. Describe the thing you love most about your job.",
    "You are {r}. Tell a short story about a surprising day.",
]
CHARACTERS = words("""a cat, a dog, a robot, a dragon, a pirate, a chef, a farmer, a teacher, a student, an
astronaut, a detective, a knight, a wizard, a baker, a gardener, a mouse, an owl, a fox, a tree, a cloud""")
DIALOGUE = [
    "Write a short dialogue between {c} and {d}.",
    "Write a short funny conversation between {c} and {d} about the weather.",
    "Write a short story in which {c} helps {d}.",
]
WHAT_IFS = words("""animals could talk, it rained lemonade, people could fly, the sun never set, cats ran the
world, trees could walk, everyone spoke the same language, there were no clocks, the ocean was made of
jelly, books could read themselves aloud, winter lasted all year, we lived on the moon, plants could
sing, cars could swim, the internet disappeared for a day, everyone had a pet dragon, shoes could talk,
houses could move, it snowed in summer, dogs could write letters, the wind had a voice, children ran the
schools, every day was a holiday, we could breathe underwater, the stars came closer, clouds were solid,
robots did all the chores, people never needed sleep, mountains could move, the moon was made of cheese""")
WHAT_IF = [
    "What would happen if {w}?",
    "Write a short story about a world where {w}.",
    "Describe a morning in a world where {w}.",
]
VOCAB = words("""curious, gentle, ancient, brave, humble, vivid, fragile, generous, stubborn, patient, clever,
cozy, gloomy, cheerful, enormous, tiny, swift, quiet, noisy, graceful, clumsy, honest, loyal, calm,
restless, eager, anxious, proud, polite, rude, fierce, timid, wise, silly, serious, bright, dull, smooth,
rough, fresh, stale, delicious, bitter, fragrant, sparkling, rusty, sturdy, hollow, narrow, spacious,
journey, harvest, shelter, whisper, echo, horizon, meadow, puzzle, treasure, lantern, festival, voyage,
courage, mystery, balance, habit, promise, memory, adventure, silence, wonder, recipe, invention,
neighbor, season, shadow, reflection, journeying, gather, wander, borrow, explore, imagine, notice,
protect, repair, celebrate, discover, encourage, forgive, improve, inspire, organize, remember, share""")
MEANING = [
    "What does the word '{v}' mean? Use it in a sentence.",
    "Write a short sentence using the word '{v}'.",
    "Explain the word '{v}' to a young child.",
]
RECIPIENTS = words("""a friend, a neighbor, a teacher, a coworker, my grandmother, my landlord, a classmate, the
library, a local bakery, my team, a new neighbor, my cousin, a pen pal, my coach, the school principal""")
SUBJECTS = words("""a birthday party, a lost book, a garden project, a weekend hike, a thank-you for help, a
movie night, moving to a new house, a cooking class, a late reply, a school fair, a broken fence, borrowing
a ladder, a book club, a charity run, a surprise visit, a noisy evening, a shared recipe, a new puppy""")
MESSAGES = [
    "Write a short email to {p} about {q}.",
    "Write a friendly text message to {p} about {q}.",
]
STYLES = [
    "Keep it short.",
    "Use simple words.",
    "Make it cheerful.",
    "Answer in one paragraph.",
    "Use a numbered list.",
    "Write it for a young child.",
    "Make it a little funny.",
    "Answer in two or three sentences.",
]

# Programming tasks, for a code base (opt-in: --code-weight). None is an open prompt's task (open-prompts.jsonl asks
# for a factorial and a string reversal); none has a number, an operator or a probe's wording.
LANGUAGES = words("Python, JavaScript, TypeScript, Go, Rust, Java, C, C++, Ruby, Bash")
CODE_TASKS = words("""removes duplicate items from a list, checks whether a word is a palindrome, counts the vowels in
a string, finds the longest word in a sentence, merges two sorted lists into one sorted list, converts a temperature
from Celsius to Fahrenheit, checks whether a year is a leap year, returns the biggest value in a list, capitalizes
the first letter of every word, reads a text file and prints each line, writes a list of names to a file, sorts a
list of names alphabetically, checks whether a string contains only digits, joins a list of words with commas,
splits a sentence into words, returns the average of a list of numbers, checks whether two words are anagrams,
flattens a nested list, groups words by their first letter, counts how often each word appears in a text, removes
extra spaces from a string, checks whether a number is prime, returns the greatest common divisor of two numbers,
builds a dictionary from two lists, finds the smallest value in a list, checks whether a list is sorted, returns
the last element of a list, converts a string to title case, validates an email address with a simple rule, swaps
the keys and values of a dictionary, returns the middle element of a list, removes all punctuation from a string,
turns a list of pairs into a dictionary, checks whether a string starts with a capital letter, finds the index of
an item in a list, returns a list without its empty strings, parses an ISO date string, formats
a number with thousands separators, reads a CSV file and prints its header, retries a function call when it fails,
caches the results of a slow function, measures how long a function takes to run, walks a folder and lists its
files, sends a greeting to every name in a list, checks whether a password is long enough, converts minutes to
hours and minutes, builds a simple to-do list class, implements a stack with push and pop, implements a queue,
implements binary search on a sorted list, implements bubble sort, implements insertion sort""")
CODE = [
    "Write a {l} function that {k}.",
    "Write a {l} function that {k}, with a short comment on each step.",
    "Show me how to write a {l} function that {k}.",
    "Write a {l} function that {k}, and give an example of calling it.",
    "Explain how a {l} function that {k} works, then write it.",
    "Write a {l} function that {k}, and add a docstring or comment that describes it.",
    "What is a clean way in {l} to write a function that {k}?",
    "Write a {l} function that {k}, and list the edge cases it handles.",
]
CODE_TOPICS = words("""a for loop, a while loop, a function, a variable, a list, a dictionary, a class, an object, a
method, recursion, an exception, a module, a string, a boolean, an if statement, a return value, a parameter, a
closure, an iterator, a generator, a hash map, a linked list, a tree, a queue, a stack, a unit test, a type, an
interface, a pointer, an array, a callback, a promise, an event loop, a thread, a lock, a file handle, a command
line argument, an environment variable, a regular expression, a JSON object, an API, a database index, a commit,
a branch, a merge conflict, a compiler, an interpreter, a syntax error, a stack trace, a null value""")
CODE_EXPLAIN = [
    "Explain {c} in {l} to a beginner, with a short example.",
    "What is {c} in {l}? Show a small example.",
    "Give a short code example in {l} that uses {c}, and explain it.",
    "What are common mistakes with {c} in {l}?",
]

# category -> (weight in the stratified sample, pool builder)
CATEGORIES = {
    "writing": (18, lambda: [t.format(t=x) for t in WRITING for x in TOPICS]),
    "explain": (16, lambda: [t.format(t=x) for t in EXPLAIN for x in TOPICS]),
    "lists": (8, lambda: [t.format(t=x) for t in LISTS for x in TOPICS]),
    "styled": (10, lambda: [f"{t.format(t=x)} {s}" for t in EXPLAIN[:6] + WRITING[:4] for x in TOPICS for s in STYLES]),
    "pairs": (10, lambda: [t.format(t=a, u=b) for t in PAIRS for a, b in itertools.combinations(PAIR_TOPICS, 2)]),
    "advice": (10, lambda: [t.format(a=a) for t in ADVICE for a in ACTIVITIES]),
    "howto": (9, lambda: [t.format(x=x) for t in HOWTO for x in TASKS] + [f"{t.format(x=x)} {s}" for t in HOWTO[:2] for x in TASKS for s in STYLES]),
    "rewrite": (6, lambda: [t.format(s=s) for t in REWRITES for s in SENTENCES]),
    "roleplay": (4, lambda: [t.format(r=r) for t in ROLE_TASKS for r in ROLES]),
    "dialogue": (4, lambda: [t.format(c=c, d=d) for t in DIALOGUE for c, d in itertools.permutations(CHARACTERS, 2)]),
    "what_if": (2, lambda: [t.format(w=w) for t in WHAT_IF for w in WHAT_IFS]),
    "meaning": (2, lambda: [t.format(v=v) for t in MEANING for v in VOCAB]),
    "messages": (2, lambda: [t.format(p=p, q=q) for t in MESSAGES for p in RECIPIENTS for q in SUBJECTS]),
}

# Categories a recipe asks for by name and weight (make_prompts' `extra`; --code-weight): none unless asked, so that
# every existing recipe's prompt file keeps its bytes.
OPT_IN = {
    "code": lambda: [t.format(l=lang, k=k) for t in CODE for lang in LANGUAGES for k in CODE_TASKS]
    + [t.format(c=c, l=lang) for t in CODE_EXPLAIN for c in CODE_TOPICS for lang in LANGUAGES],
}

# What evaluate-probes asks (a2d_convert/probes.py): none of this may appear in a training prompt.
PROBE_PATTERNS = [
    r"\d\s*[-+*/x]\s*\d", r"\bplus\b", r"\bminus\b", r"\btimes\b\s+\d", r"\bwhat is \d", r"which number", r"\blarger\b",
    r"comes next", r"\brepeat\b", r"how many times does the letter", r"\bletter only\b", r"\bnumber only\b",
    r"\b[A-D]\)", r"which of these",
]


def probe_like(prompt: str) -> str | None:
    text = prompt.lower()
    return next((p for p in PROBE_PATTERNS if re.search(p, text)), None)


def categories(extra: dict[str, int] | None = None) -> dict:
    """CATEGORIES and the opt-in ones asked for (name -> weight; a weight of 0 leaves it out)."""
    chosen = dict(CATEGORIES)
    for name, weight in (extra or {}).items():
        if name not in OPT_IN:
            raise SystemExit(f"no opt-in prompt category {name!r}; there are: {', '.join(sorted(OPT_IN))}")
        if weight < 0:
            raise SystemExit(f"the {name} category's weight must be 0 or more, not {weight}")
        if weight > 0:
            chosen[name] = (weight, OPT_IN[name])
    return chosen


def pools(extra: dict[str, int] | None = None) -> dict[str, list[str]]:
    return {name: sorted(set(build())) for name, (_, build) in categories(extra).items()}


def all_prompts(extra: dict[str, int] | None = None) -> list[str]:
    """Every distinct prompt any category can write, sorted."""
    return sorted({p for pool in pools(extra).values() for p in pool})


def quotas(sizes: dict[str, int], count: int, weights: dict[str, int]) -> dict[str, int]:
    """Per-category counts summing to `count`: proportional to the weights, capped by each pool's size."""
    if count > sum(sizes.values()):
        raise SystemExit(f"--count {count}: only {sum(sizes.values())} distinct prompts can be written; ask for fewer")
    share = {name: 0 for name in sizes}
    left = count
    open_ = [n for n in sizes if sizes[n] > 0]
    while left > 0 and open_:
        weight = sum(weights[n] for n in open_)
        # Largest-remainder split of what is left over the categories with room.
        exact = {n: left * weights[n] / weight for n in open_}
        give = {n: min(int(exact[n]), sizes[n] - share[n]) for n in open_}
        rest = left - sum(give.values())
        for n in sorted(open_, key=lambda n: (-(exact[n] - int(exact[n])), n)):
            if rest <= 0:
                break
            if give[n] < sizes[n] - share[n]:
                give[n] += 1
                rest -= 1
        for n in open_:
            share[n] += give[n]
        left = count - sum(share.values())
        open_ = [n for n in open_ if share[n] < sizes[n]]
    return share


def make_prompts(count: int, seed: int, extra: dict[str, int] | None = None) -> list[dict[str, str]]:
    """`count` distinct prompts, stratified over the categories (and the opt-in ones in `extra`, name -> weight),
    shuffled; the same for the same arguments."""
    chosen = categories(extra)
    by_category = pools(extra)
    seen: set[str] = set()
    for name in by_category:  # a prompt two categories can both write belongs to the first only
        by_category[name] = [p for p in by_category[name] if p not in seen]
        seen.update(by_category[name])
    share = quotas({n: len(p) for n, p in by_category.items()}, count, {n: w for n, (w, _) in chosen.items()})
    rows = []
    for name, pool in by_category.items():
        random.Random(f"{seed}:{name}").shuffle(pool)
        rows += [{"prompt": p, "category": name} for p in pool[: share[name]]]
    random.Random(seed).shuffle(rows)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSONL file to write ({\"prompt\": ..., \"category\": ...} per line)")
    parser.add_argument("--count", type=int, default=6000, help="how many distinct prompts to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--code-weight", type=int, default=0,
                        help="add the programming-task category at this weight (the others weigh 2-18 each; default 0: none)")
    args = parser.parse_args()
    rows = make_prompts(args.count, args.seed, {"code": args.code_weight})
    with open(Path(args.out), "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    counts = {}
    for row in rows:
        counts[row["category"]] = counts.get(row["category"], 0) + 1
    print(f"wrote {len(rows)} prompts to {args.out}: {json.dumps(counts)}")


if __name__ == "__main__":
    main()
