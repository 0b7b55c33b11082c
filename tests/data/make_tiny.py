"""Build the tiny checked-in test corpus ``tests/data/tiny/`` and its ``expected.json``.

Run once (``python tests/data/make_tiny.py``) and check the outputs in; the build is
deterministic (gzip without a timestamp, fixed zstd level, Parquet without statistics drift).

Three sources:

- ``news``  one plain JSONL file (``text``, ``id``, ``url``, metadata ``title``/``published``)
- ``forum`` one ``.jsonl.gz`` and one ``.jsonl.zst`` file (text in ``body``, id in ``post_id``)
- ``wiki``  two Parquet files: ``pages-0.parquet`` (``page_id``, ``title``, ``text``, ``revision``)
  and ``legacy-0.parquet`` whose ``text`` column is an integer (wrong schema)

Every record is planted with the outcome it must get: kept, quarantined (reason), removed by a
heuristic rule (the first failing one), or a member of an exact-duplicate group. The expected
counts in ``expected.json`` are derived from these plantings alone, with the crawl's keep rule
(``source_priority`` wiki 0, news 1, forum 2; the lowest wins): the pipeline is never run here.
The planted heuristic reasons are only *checked* against ``stages.kernels.heuristics.decide``
so that a wrongly planted document fails loudly at build time.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

OUT = Path(__file__).resolve().parent / "tiny"
PRIORITY = {"wiki": 0, "news": 1, "forum": 2}
SOURCES = {
    "news": {"path": "news", "text_field": "text", "id_field": "id", "url_field": "url"},
    "forum": {"path": "forum/*", "text_field": "body", "id_field": "post_id"},
    "wiki": {"path": "wiki", "text_field": "text", "id_field": "page_id"},
}

# --- good documents: realistic English prose, 60-300 words, pass every default rule ------------

GOOD: dict[str, str] = {
    "council_budget": (
        "The city council approved a revised budget on Tuesday evening after nearly four hours of debate. "
        "The plan sets aside more money for road repairs and library hours, while delaying the renovation "
        "of the old fire station until next spring. Several residents spoke during the public comment "
        "period, and most of them asked the council to protect funding for the summer youth program. "
        "Councilmember Ortiz said the final version was a compromise that nobody loved but everyone could "
        "accept. The mayor is expected to sign the budget by the end of the week."
    ),
    "storm_power": (
        "A line of strong thunderstorms moved across the valley late on Sunday, knocking down trees and "
        "leaving about twelve thousand homes without power. Utility crews worked through the night, and by "
        "Monday morning most customers had their electricity restored. Forecasters said the storms formed "
        "along a cold front that brought a sharp drop in temperature. No serious injuries were reported, "
        "although one driver was treated for minor cuts after a branch fell onto his car near the river "
        "bridge. Officials urged people to stay away from downed lines and to report them right away."
    ),
    "marathon": (
        "More than three thousand runners took part in the annual harbor marathon this weekend, the largest "
        "field in the history of the event. The men's race was won by a local teacher who trained on the "
        "hills behind his school, and the women's title went to a student from the university track team. "
        "Volunteers handed out water and oranges at every mile marker, and neighbors along the course "
        "cheered with drums and homemade signs. Organizers said the cool weather helped many runners set "
        "personal records, and they hope to add a relay division next year."
    ),
    "telescope": (
        "Astronomers at the mountain observatory have finished installing a new infrared camera on the "
        "largest telescope at the site. The instrument can detect faint heat from dust clouds where young "
        "stars are forming, and it should help researchers measure how quickly those stars gather mass. "
        "The project took six years and involved engineers from three countries. According to the lead "
        "scientist, the first test images were sharper than expected, partly because the camera is cooled "
        "to a temperature close to that of liquid nitrogen. Regular observations are scheduled to begin in "
        "the autumn."
    ),
    "bakery": (
        "A family bakery that has operated on Main Street for sixty years will close its doors at the end of "
        "the month. The owners, a brother and sister who took over from their parents, said rising costs and "
        "the long hours finally made them decide to retire. Customers lined up around the block on Saturday "
        "to buy one last loaf of rye bread or a box of the famous almond cookies. Many of them shared stories "
        "about birthday cakes and wedding orders from decades ago. The building has already been sold, but "
        "the new owner has not announced any plans."
    ),
    "rail_line": (
        "Regional transit officials announced that the new light rail extension will open to passengers in "
        "early March. The line adds five stations and connects the airport with the central business "
        "district in about twenty minutes. Trains will run every eight minutes during rush hour and every "
        "fifteen minutes in the evening. Construction was delayed twice, first by a shortage of steel and "
        "later by the discovery of an old water main under a busy intersection. Officials expect about "
        "fourteen thousand riders a day during the first year of service."
    ),
    "school_garden": (
        "Students at Riverside Elementary spent the spring building a vegetable garden behind the gym, and "
        "this week they harvested their first crop of lettuce, radishes and peas. Teachers use the garden "
        "for lessons on plant biology, measurement and even writing, since each class keeps a journal of "
        "what grows and what fails. A local hardware store donated lumber for the raised beds, and parents "
        "volunteered on weekends to water the plants. The principal said she hopes to add a small "
        "greenhouse so that the children can keep growing food during the winter."
    ),
    "museum_exhibit": (
        "The history museum opened a new exhibit on Friday about the people who built the canal that once "
        "carried coal and grain through the region. Visitors can see tools, letters and photographs donated "
        "by the families of the workers, many of whom were recent immigrants. One room recreates a lock "
        "keeper's cottage, complete with a wood stove and a narrow bed. The curator said the goal was to "
        "show the daily lives of ordinary workers rather than only the engineers and investors. The exhibit "
        "will remain open until the end of next year."
    ),
    "farm_prices": (
        "Wheat farmers in the northern counties are facing a difficult season as prices fall and the cost "
        "of fuel and fertilizer continues to climb. Several growers said they planted fewer acres this year "
        "and switched part of their land to lentils, which need less nitrogen. Agricultural economists at "
        "the state university warned that small farms with large loans are the most exposed. A farmers' "
        "cooperative has asked lawmakers to extend a program that helps pay for storage, so that growers "
        "can hold their grain until prices recover."
    ),
    "library_hours": (
        "Starting next month, the public library will stay open until nine o'clock on weeknights and will "
        "add Sunday afternoon hours at the two largest branches. The change follows a survey in which many "
        "residents said they could not visit during the working day. The library also plans to expand its "
        "collection of audiobooks and to lend laptops and wireless hotspots to families who need them for "
        "school. Staff members said the new schedule required hiring four part-time workers, which the "
        "recent budget made possible."
    ),
    "bike_chain": (
        "My road bike started making a clicking noise every time I pedal hard, and it only happens in the "
        "two smallest cogs at the back. I cleaned and oiled the chain last week, so I doubt that is the "
        "problem. The derailleur seems to shift fine on the stand, but the noise comes back as soon as I "
        "climb a hill. Could this be a worn cassette, or should I check the bottom bracket first? The bike "
        "has about four thousand miles on it and I have never replaced anything except the tires and brake "
        "pads. Any advice would be appreciated."
    ),
    "sourdough": (
        "I have been baking sourdough for about a year, and the best change I made was switching to a longer "
        "and colder proof. After shaping the loaf I put it in the fridge overnight, usually for twelve to "
        "fourteen hours, and bake it straight from the cold. The dough is much easier to score, and the "
        "crust gets those nice blisters that people like. I also stopped adding so much water, because a "
        "slightly stiffer dough holds its shape better in a round basket. If your starter is young, give it "
        "a few weeks before you judge the results."
    ),
    "tomatoes": (
        "Every summer my tomato plants grow tall and green but give me very little fruit until late August. "
        "A neighbor told me that I probably use too much fertilizer, and that plenty of nitrogen makes leaves "
        "instead of flowers. This year I tried a low nitrogen feed and pinched off some of the side shoots, "
        "and the difference was obvious by the middle of July. I also moved the pots to the sunniest corner "
        "of the yard. If anyone has tips for keeping the plants healthy during a very hot week, I would love "
        "to hear them."
    ),
    "python_help": (
        "I am writing a small script that reads a large log file and counts how often each error code "
        "appears. It works on my test file, but on the real one it runs out of memory because I load the "
        "whole file into a list first. Someone suggested reading the file line by line with a loop and "
        "keeping the counts in a dictionary, which makes sense to me. Is there anything else I should watch "
        "out for, like encoding problems or very long lines? The file is about twenty gigabytes and comes "
        "from an old server."
    ),
    "camera_advice": (
        "I am planning a trip to the mountains and want to upgrade from my phone to a real camera. My budget "
        "is limited, so I am looking at used models that are a few years old. Most of my photos will be "
        "landscapes and some wildlife, mainly birds if I am lucky. Is it better to spend more on the body or "
        "on a good lens? A friend says that lenses keep their value and last longer, while the body is the "
        "part that gets outdated. I would be grateful for any recommendations from people who have made a "
        "similar choice."
    ),
    "train_travel": (
        "Last spring my partner and I crossed the country by train instead of flying, and it was one of the "
        "best trips we have ever taken. The journey took three days, with a sleeping cabin that was small "
        "but comfortable. We spent hours in the observation car watching the prairie turn into mountains, "
        "and the food in the dining car was better than we expected. It costs more than a plane ticket and "
        "it is certainly slower, but the slow pace was the whole point. I would recommend bringing a good "
        "book and some snacks."
    ),
    "leaky_faucet": (
        "Our kitchen faucet has been dripping for weeks, and I finally decided to fix it myself instead of "
        "calling a plumber. After turning off the water under the sink, I removed the handle and found a "
        "cracked rubber washer inside the cartridge. The hardware store had the exact replacement for a "
        "couple of dollars. The whole repair took about forty minutes, most of which I spent looking for "
        "the right screwdriver. If you try this, take photos as you take things apart, so that you know "
        "how everything goes back together."
    ),
    "aquarium": (
        "I set up my first freshwater aquarium three months ago, and I made the classic mistake of adding "
        "too many fish during the first week. The water turned cloudy and two of the tetras died before I "
        "understood what was happening. A shop owner explained the nitrogen cycle to me and suggested "
        "testing the water every day and changing a quarter of it twice a week. Things are stable now, and "
        "the plants are growing well. My advice to beginners is to be patient and to let the tank cycle "
        "before buying any fish."
    ),
    "river": (
        "The Alder River is a river in the northern part of the region, about one hundred and forty miles "
        "long. It rises in a series of small lakes on the high plateau and flows south through forests and "
        "farmland before joining a larger river near the town of Millbrook. For much of the nineteenth "
        "century the river was used to float timber to sawmills downstream, and several old dams remain "
        "along its course. Today the river is known for its trout fishing and for a popular canoe route "
        "that takes about a week to complete."
    ),
    "bridge": (
        "The Harbor Bridge is a steel suspension bridge that carries a highway and a railway across the "
        "mouth of the bay. Construction began in the early twentieth century and lasted almost eight years, "
        "partly because the foundations had to be sunk through deep layers of soft mud. When it opened, it "
        "had the longest main span of any bridge in the country. The bridge was strengthened in the 1980s "
        "to carry heavier trucks, and a pedestrian walkway was added on the eastern side. It appears on "
        "many postcards of the city."
    ),
    "heron": (
        "The grey heron is a large wading bird found across much of Europe, Asia and parts of Africa. It "
        "stands up to one metre tall and has a long neck, a sharp yellow bill and pale grey feathers on the "
        "back. Herons feed mainly on fish, which they catch by standing very still in shallow water and "
        "striking quickly. They also eat frogs, small mammals and insects. The birds usually nest in "
        "colonies at the tops of tall trees, and the same nesting sites may be used for many decades."
    ),
    "copper": (
        "Copper is a chemical element with the symbol Cu and atomic number 29. It is a soft and ductile metal "
        "with very high thermal and electrical conductivity, which is why most electrical wiring is made of "
        "it. Copper is one of the few metals that can occur in nature in a directly usable form, and it was "
        "worked by people for thousands of years before iron. Alloys such as bronze and brass contain copper "
        "combined with tin or zinc. When exposed to air over a long time, the metal develops a green layer "
        "called a patina."
    ),
    "composer": (
        "Clara Lindqvist was a composer and pianist who wrote more than two hundred songs and several works "
        "for string quartet. She studied at the conservatory in the capital and later taught harmony there "
        "for nearly thirty years. Her early pieces show the influence of folk melodies that she collected "
        "during summer trips to the countryside. Critics at the time praised her songs but paid less "
        "attention to her chamber music, which has been recorded more often in recent decades. A street in "
        "her home town is named after her."
    ),
    "volcano": (
        "Mount Tarrin is a stratovolcano on the eastern edge of the island chain. Its last major eruption "
        "took place in the eighteenth century, when ash and lava flows destroyed two villages on the lower "
        "slopes. The volcano is now monitored by a network of seismic stations and gas sensors, because "
        "small earthquakes beneath the summit are still recorded every year. The upper part of the mountain "
        "is a national park with hiking trails, hot springs and a crater lake that changes colour with the "
        "seasons."
    ),
    "lighthouse": (
        "The Point Grey lighthouse stands on a rocky headland at the entrance to the sound. The first tower "
        "was built of wood and burned down after a lightning strike, so the current stone tower replaced it "
        "in the middle of the nineteenth century. For many years a keeper and his family lived in the small "
        "house next to the tower and tended the lamp every night. The light was automated in the 1960s, and "
        "the keeper's house is now a small museum. The tower is open to visitors during the summer months."
    ),
    "typeface": (
        "Meridian is a serif typeface designed for newspaper printing in the years after the war. Its "
        "letters have a large height and short descenders, which allowed editors to fit more lines into a "
        "narrow column without making the text hard to read. The designer paid special attention to how "
        "the shapes held up on cheap paper and fast presses, where fine details tend to disappear. The face "
        "was later adapted for phototypesetting and then for digital use, and it is still common in books "
        "and magazines."
    ),
    # Shared between sources (cross-source duplicate groups).
    "eclipse": (
        "On the morning of the eclipse, thousands of people gathered on the hills outside the town to watch "
        "the moon pass in front of the sun. The sky grew dark for a little more than two minutes, and the "
        "temperature dropped so quickly that many spectators reached for their jackets. Birds went quiet "
        "and the street lights in the valley switched on. Local schools handed out special glasses, and "
        "science teachers explained how to look at the sun safely. Hotels in the area were fully booked "
        "for the whole weekend, and traffic on the main road was heavy until late in the evening."
    ),
    "recycling": (
        "The county has changed the rules for curbside recycling, and residents no longer need to sort "
        "paper, glass and plastic into separate bins. Everything goes into one large container that is "
        "collected every other week. Officials said the change should increase the amount of material that "
        "is recycled, since many people found the old system confusing. However, food waste and plastic "
        "bags are still not accepted, because they jam the machines at the sorting plant. A guide with "
        "pictures of accepted items will be mailed to every household."
    ),
    "chess_club": (
        "The chess club at the community center meets every Thursday evening, and new players of any age "
        "are always welcome. We have beginners who are still learning how the pieces move and a few strong "
        "players who compete in regional tournaments. Each meeting starts with a short lesson on an opening "
        "or an endgame idea, and then everyone plays casual games. Boards and clocks are provided, so you "
        "do not need to bring anything. Coffee and tea are free, and there is usually a plate of cookies "
        "on the table by the window."
    ),
    "case_sensitive": (
        "The old mill on the creek has been restored by a group of volunteers who spent five summers "
        "repairing the water wheel, the stone floor and the wooden gears. Visitors can now watch the mill "
        "grind corn into meal on the first Saturday of each month. The volunteers also planted native "
        "flowers along the millrace and built a small bridge so that families can walk around the pond. "
        "Donations from local businesses paid for most of the materials, and the rest came from a bake sale "
        "held at the fire station."
    ),
    "lorem_page": (
        "Our new community newsletter will appear every month with stories about local businesses, events "
        "and the people who make this neighborhood special. We are still looking for volunteers to write "
        "short articles, take photographs and help with the delivery. The first issue will include an "
        "interview with the owner of the hardware store and a calendar of summer concerts in the park. "
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut "
        "labore et dolore magna aliqua. Please send your ideas to the editor before the end of the month."
    ),
}

# --- junk: each fails one specific default rule first --------------------------------------------

JUNK: dict[str, tuple[str, str]] = {
    # name: (text, the first rule in RULES order that fails)
    "short_teaser": ("Breaking news: more details will follow soon.", "min_words"),
    "subscribe": ("Subscribe now to read the full story and get unlimited access.", "min_words"),
    "nav_menu": (
        "\n".join([
            "Home and Garden Furniture Lighting Kitchen and Dining Storage",
            "Men Women Kids Shoes Bags Accessories Jewelry Watches",
            "Deals of the Day Clearance Gift Cards Store Locator",
            "Help Center Returns Shipping Order Status Contact Us",
            "About Us Careers Press Investors Sustainability Blog",
            "Terms of Use Privacy Policy Cookie Settings Accessibility",
            "Follow us on social media and join the newsletter",
        ]),
        "min_terminal_punct_lines_frac",
    ),
    "spam_lines": (
        "\n".join(["Buy cheap watches online today and save the most money on the best brands."] * 6),
        "max_dup_line_frac",
    ),
    "hashtags": (
        "Had the best weekend at the lake with the whole crew and the weather was perfect the entire time. "
        "#summer #lake #friends #weekend #sunset #goodvibes #travel #nature #photography #family #fun "
        "#blessed #happy #instagood #love #beautiful #outdoors #adventure #relax #memories. Thanks to "
        "everyone who came along and brought food for the grill.",
        "max_symbol_word_ratio",
    ),
    "bullets": (
        "\n".join([
            "• two cups of flour and a pinch of salt",
            "• one cup of warm milk with the yeast",
            "• three eggs beaten together with sugar",
            "• half a cup of melted butter to finish",
            "• the zest of one lemon and some vanilla",
            "• a handful of raisins soaked in warm tea",
            "• powdered sugar to dust the top of the cake",
            "• a little oil to grease the baking pan",
        ]),
        "max_bullet_lines_frac",
    ),
    "ellipses": (
        "\n".join([
            "So I was walking home from work yesterday and you will never guess what happened...",
            "There was a dog sitting right in the middle of the road with a hat on...",
            "Everybody stopped their cars to take a picture of the dog and the hat...",
            "Then the owner came running out of a shop and apologized to all of the drivers.",
            "Honestly it was the best thing that happened to me all week and I wanted to share it...",
        ]),
        "max_ellipsis_lines_frac",
    ),
    "stats_table": (
        "Population by year for the district and the town: "
        + " ".join(f"{1900 + 10 * i} {12000 + 731 * i} {3400 + 97 * i}" for i in range(13))
        + " with the totals of the census.",
        "min_alpha_words_frac",
    ),
    "stub": ("Millbrook is a town in the county. It has a school and a church.", "min_words"),
}


# --- planting ---------------------------------------------------------------------------------------


@dataclass
class Plant:
    source: str
    file: str
    payload: bytes | dict[str, Any]  # JSONL line bytes, or one Parquet row
    outcome: str  # "kept" | "heuristic:<rule>" | "quarantine:<reason>" | "dup:<group>" | "lorem"
    record_id: str | None = None


def nfkc_variant(text: str) -> str:
    """``text`` with compatibility characters that NFKC maps back: a ligature, full-width
    letters, an ideographic, a no-break and an em space."""
    out = text.replace("traffic", "tra\ufb03c", 1)  # U+FB03 LATIN SMALL LIGATURE FFI
    out = out.replace("moon", "\uff4d\uff4f\uff4f\uff4e", 1)  # full-width "moon"
    out = out.replace(" sun", "\u3000sun", 1).replace(" the ", "\u00a0the\u2003", 1)
    assert out != text
    return out


def whitespace_variant(text: str) -> str:
    """``text`` with doubled spaces, a tab, line breaks and surrounding blanks."""
    words = text.split(" ")
    words[5] = words[5] + " "
    words[10] = words[10] + "\t"
    words[20] = words[20] + "\r\n"
    return "  \n" + " ".join(words) + " \n\n"


def plant() -> list[Plant]:
    p: list[Plant] = []

    def news(rec_id: str, text: Any, outcome: str, **extra: Any) -> None:
        rec = {"id": rec_id, "url": f"https://news.example/{rec_id}", "title": rec_id.replace("-", " "),
               "published": "2024-05-01", **extra}
        if text is not ...:
            rec["text"] = text
        p.append(Plant("news", "news/news-2024-05.jsonl", rec, outcome, rec_id))

    def forum(file: str, rec_id: str, body: Any, outcome: str, **extra: Any) -> None:
        rec = {"post_id": rec_id, "thread": "t" + rec_id[-2:], "author": f"user{rec_id[-1]}", **extra}
        if body is not ...:
            rec["body"] = body
        p.append(Plant("forum", f"forum/{file}", rec, outcome, rec_id))

    def wiki(rec_id: str, text: str | None, outcome: str) -> None:
        row = {"page_id": rec_id, "title": rec_id.title(), "text": text, "revision": len(p)}
        p.append(Plant("wiki", "wiki/pages-0.parquet", row, outcome, rec_id))

    def raw(source: str, file: str, line: bytes, outcome: str, rec_id: str | None = None) -> None:
        p.append(Plant(source, file, line, outcome, rec_id))

    # news: good documents
    for i, name in enumerate(["council_budget", "storm_power", "marathon", "telescope", "bakery",
                              "rail_line", "school_garden", "museum_exhibit"]):
        news(f"news-{i:03d}", GOOD[name], "kept")
    news("news-010", GOOD["case_sensitive"], "kept")
    news("news-011", GOOD["case_sensitive"].replace("The old mill", "the old mill"), "kept")  # case differs
    # news: an identical record twice (same id, same everything) -> distinct doc_ids, one exact dup
    news("news-020", GOOD["farm_prices"], "dup:farm_identical")
    news("news-020", GOOD["farm_prices"], "dup:farm_identical")
    # news: whitespace variant of its own document, different ids
    news("news-021", GOOD["library_hours"], "dup:library_ws")
    news("news-022", whitespace_variant(GOOD["library_hours"]), "dup:library_ws")
    # cross-source groups
    news("news-030", whitespace_variant(GOOD["eclipse"]), "dup:eclipse")
    news("news-031", GOOD["recycling"], "dup:recycling")
    # junk
    news("news-040", JUNK["short_teaser"][0], "heuristic:min_words")
    news("news-041", JUNK["subscribe"][0], "heuristic:min_words")
    news("news-042", JUNK["subscribe"][0], "heuristic:min_words")  # junk duplicate: heuristic wins
    news("news-043", JUNK["nav_menu"][0], "heuristic:min_terminal_punct_lines_frac")
    news("news-044", JUNK["spam_lines"][0], "heuristic:max_dup_line_frac")
    news("news-045", GOOD["lorem_page"], "lorem")
    # news: bad records
    f = "news/news-2024-05.jsonl"
    raw("news", f, b'{"id": "news-900", "text": "an unterminated string}', "quarantine:invalid_json")
    raw("news", f, b'{"id": "news-901", "text": "caf\xe9 au lait \xff\xfe"}', "quarantine:invalid_utf8")
    news("news-902", None, "quarantine:missing_text")
    news("news-903", 42, "quarantine:text_not_string")
    news("news-904", ["a", "list", "of", "words"], "quarantine:text_not_string")
    news("news-905", ..., "quarantine:missing_text")  # no text field at all
    news("news-906", "", "quarantine:empty_text")
    news("news-907", "  \n\t ", "quarantine:empty_text")
    news("news-908", GOOD["telescope"][:200] + "\x00" + GOOD["telescope"][200:], "quarantine:nul_byte")
    raw("news", f, b'["an", "array", "instead", "of", "an", "object"]', "quarantine:not_an_object")
    raw("news", f, b"", "blank")  # a blank line is no record: neither counted nor quarantined

    # forum: .jsonl.gz
    gz = "posts-2024-05.jsonl.gz"
    for i, name in enumerate(["bike_chain", "sourdough", "tomatoes", "python_help"]):
        forum(gz, f"p-1{i:02d}", GOOD[name], "kept")
    forum(gz, "p-110", GOOD["chess_club"], "dup:chess")  # same text in the .gz and the .zst file
    forum(gz, "p-120", nfkc_variant(GOOD["eclipse"]), "dup:eclipse")
    forum(gz, "p-121", GOOD["recycling"], "dup:recycling")
    forum(gz, "p-130", JUNK["hashtags"][0], "heuristic:max_symbol_word_ratio")
    forum(gz, "p-131", JUNK["bullets"][0], "heuristic:max_bullet_lines_frac")
    raw("forum", f"forum/{gz}", b'{"post_id": "p-190", "body": "missing quote}', "quarantine:invalid_json")
    forum(gz, "p-191", {"nested": "object"}, "quarantine:text_not_string")
    forum(gz, "p-192", ..., "quarantine:missing_text", text="the text is in the wrong field")
    # forum: .jsonl.zst
    zst = "posts-2024-06.jsonl.zst"
    for i, name in enumerate(["camera_advice", "train_travel", "leaky_faucet", "aquarium"]):
        forum(zst, f"p-2{i:02d}", GOOD[name], "kept")
    forum(zst, "p-210", whitespace_variant(GOOD["chess_club"]), "dup:chess")
    forum(zst, "p-230", JUNK["ellipses"][0], "heuristic:max_ellipsis_lines_frac")
    forum(zst, "p-231", JUNK["short_teaser"][0], "heuristic:min_words")
    raw("forum", f"forum/{zst}", b'"just a string"', "quarantine:not_an_object")
    forum(zst, "p-291", "", "quarantine:empty_text")
    raw("forum", f"forum/{zst}", b'{"post_id": "p-292", "body": "\xc3\x28 broken"}', "quarantine:invalid_utf8")

    # wiki: Parquet
    wiki("heron", GOOD["heron"], "dup:heron")
    for name in ["river", "bridge", "copper", "composer", "volcano", "lighthouse", "typeface"]:
        wiki(name, GOOD[name], "kept")
    wiki("eclipse", GOOD["eclipse"], "dup:eclipse")
    wiki("heron-copy", GOOD["heron"], "dup:heron")  # same text on two pages of one source
    wiki("stats", JUNK["stats_table"][0], "heuristic:min_alpha_words_frac")
    wiki("stub", JUNK["stub"][0], "heuristic:min_words")
    wiki("null-text", None, "quarantine:missing_text")
    wiki("empty", "", "quarantine:empty_text")
    wiki("nul", "Some\x00text with a NUL character in the middle of it.", "quarantine:nul_byte")
    # wiki: a legacy export whose text column is an integer -> one wrong_schema row per record
    for i in range(3):
        p.append(Plant("wiki", "wiki/legacy-0.parquet", {"page_id": f"legacy-{i}", "text": 1000 + i},
                       "quarantine:wrong_schema", None))
    return p


# --- expected counts, from the plantings only ----------------------------------------------------


def derive(plants: list[Plant], *, exact: bool = True, lorem_rule: bool = True) -> dict[str, Any]:
    """Counts per source and stage, quarantine and heuristic reasons, and exact groups."""
    outcome: dict[int, str] = {}  # index -> final outcome word
    groups: dict[str, list[int]] = defaultdict(list)
    for i, pl in enumerate(plants):
        if pl.outcome == "blank":
            continue
        if pl.outcome == "lorem":
            outcome[i] = "heuristic:max_lorem_ipsum" if lorem_rule else "kept"
        elif pl.outcome.startswith("dup:"):
            groups[pl.outcome[4:]].append(i)
        else:
            outcome[i] = pl.outcome
    survivors: dict[str, dict[str, Any]] = {}
    for name, members in groups.items():
        if not exact:
            for i in members:
                outcome[i] = "kept"
            continue
        # The keep rule: lowest source priority wins; within a source any copy may (doc_id decides).
        best = min(PRIORITY[plants[i].source] for i in members)
        winner = next(i for i in members if PRIORITY[plants[i].source] == best)
        for i in members:
            outcome[i] = "kept" if i == winner else "exact"
        survivors[name] = {
            "kept_source": plants[winner].source,
            "members": [[plants[i].source, plants[i].record_id] for i in members],
            "removed": dict(Counter(plants[i].source for i in members if i != winner)),
        }
    counts: dict[str, Any] = {}
    quarantine: dict[str, Counter[str]] = defaultdict(Counter)
    heuristic: dict[str, Counter[str]] = defaultdict(Counter)
    for i, out in outcome.items():
        src = plants[i].source
        c = counts.setdefault(src, {"input": 0, "kept": 0, "quarantined": 0,
                                    "removed": {"heuristic": 0, "exact": 0}})
        c["input"] += 1
        kind, _, why = out.partition(":")
        if kind == "kept":
            c["kept"] += 1
        elif kind == "quarantine":
            c["quarantined"] += 1
            quarantine[src][why] += 1
        elif kind == "heuristic":
            c["removed"]["heuristic"] += 1
            heuristic[src][why] += 1
        else:
            c["removed"]["exact"] += 1
    return {
        "counts": dict(sorted(counts.items())),
        "quarantine_reasons": {s: dict(sorted(quarantine[s].items())) for s in sorted(counts)},
        "heuristic_reasons": {s: dict(sorted(heuristic[s].items())) for s in sorted(counts)},
        "exact_groups": dict(sorted(survivors.items())),
        "outcomes": _outcomes(plants, outcome),
    }


def _outcomes(plants: list[Plant], outcome: dict[int, str]) -> dict[str, dict[str, str]]:
    """record_id -> outcome of every planted record outside duplicate groups that has a record id
    and whose id is unique in its source."""
    ids = Counter((pl.source, pl.record_id) for pl in plants)
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for i, word in outcome.items():
        pl = plants[i]
        if pl.record_id is None or ids[(pl.source, pl.record_id)] > 1 or pl.outcome.startswith("dup:"):
            continue
        if word.startswith("quarantine:") and not isinstance(pl.payload, dict):
            continue  # the record id of an unparseable line is unknown to the pipeline
        out[pl.source][pl.record_id] = word
    return {s: dict(sorted(v.items())) for s, v in sorted(out.items())}


# --- writing ------------------------------------------------------------------------------------------


def _line(payload: bytes | dict[str, Any]) -> bytes:
    if isinstance(payload, bytes):
        return payload
    return json.dumps(payload, ensure_ascii=False).encode("utf-8")


def write(plants: list[Plant]) -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    files: dict[str, list[Plant]] = defaultdict(list)
    for pl in plants:
        files[pl.file].append(pl)
    for rel, rows in files.items():
        path = OUT / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".parquet"):
            table = pa.Table.from_pylist([r.payload for r in rows])  # type: ignore[misc]
            pq.write_table(table, path, compression="zstd", write_statistics=False)
            continue
        data = b"".join(_line(r.payload) + b"\n" for r in rows)
        if rel.endswith(".gz"):
            buf = io.BytesIO()
            with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
                gz.write(data)
            data = buf.getvalue()
        elif rel.endswith(".zst"):
            data = zstandard.ZstdCompressor(level=10).compress(data)
        path.write_bytes(data)


def check_plantings(plants: list[Plant]) -> None:
    """Every planted document gets the planted heuristic decision (the rule that fires first)."""
    from stages.kernels.heuristics import decide, score_documents
    from stages.params import FilteredDocumentsParams

    docs = [pl for pl in plants if isinstance(pl.payload, dict)
            and isinstance(pl.payload.get("text", pl.payload.get("body")), str)
            and (pl.outcome in ("kept", "lorem") or pl.outcome.split(":")[0] in ("heuristic", "dup"))]
    texts = [pl.payload.get("text", pl.payload.get("body")) for pl in docs]  # type: ignore[union-attr]
    keep, reason, _ = decide(score_documents(texts), FilteredDocumentsParams())
    for pl, k, r, text in zip(docs, keep, reason, texts, strict=True):
        want = "max_lorem_ipsum" if pl.outcome == "lorem" else (
            pl.outcome.split(":", 1)[1] if pl.outcome.startswith("heuristic:") else None)
        if r != want or bool(k) != (want is None):
            raise AssertionError(f"{pl.source}/{pl.record_id}: planted {pl.outcome}, heuristics say {r}")
        n = len(text.split())
        if want is None and not 60 <= n <= 300:
            raise AssertionError(f"{pl.source}/{pl.record_id}: a good document has {n} words")


def main() -> None:
    plants = plant()
    check_plantings(plants)
    write(plants)
    expected = {
        "crawl": "tiny",
        "sources": SOURCES,
        "keep": {"source_priority": PRIORITY},
        "default": derive(plants),
        "without_lorem_rule": derive(plants, lorem_rule=False),
        "heuristic_only": derive(plants, exact=False),
    }
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    size = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"wrote {OUT} ({size} bytes)")


if __name__ == "__main__":
    main()
