"""What the demo voices say (demo contract v3): Chinese for the Mandarin voices, each other
synthesizer voice its own language. The description is of the voice, so the text only has to be
ordinary speech of varied length; held-out sets use clauses/sentences that never occur in training
(whole clauses held out, as in version 2), so accuracy measures listening, not memorised text.

Chinese clauses come from `corpus.clause_pool` (version 2's); the other languages from small word
lists composed into simple clauses. Non-English Latin-script languages are written without
diacritics: festival's Czech, Finnish, Italian and Catalan voices read 8-bit text in legacy code pages,
and plain ASCII reads the same in all of them (checked: a Czech line with and without diacritics
speaks within 5 % of the same length). Russian is UTF-8, which festival's Russian voice reads.
"""

from __future__ import annotations

import itertools
import random
from functools import cache

from .corpus import clause_pool, n_spoken

# Per language: subjects, verbs/predicates, objects/complements (composed as S V O).
_WORDS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "en": (
        ["I", "we", "you", "my brother", "the teacher", "our neighbour", "the children", "my mother", "the driver",
         "a friend of mine", "the doctor", "everyone", "the old man", "my sister", "the students", "the manager"],
        ["wanted to visit", "will bring", "often reads", "likes", "never forgets", "is painting", "bought",
         "found", "cleaned", "carried", "opened", "is waiting for", "remembered", "wrote about", "fixed", "watched"],
        ["the old house", "a cup of tea", "the morning paper", "some fresh bread", "the garden", "a long letter",
         "the small boat", "the blue car", "an old song", "the kitchen window", "the train station", "a new book",
         "the river bank", "the market square", "the red door", "a quiet room"],
    ),
    "it": (
        ["io", "noi", "il maestro", "mia madre", "il ragazzo", "la signora", "gli amici", "mio padre", "il medico",
         "la bambina", "tutti", "il vicino"],
        ["compra", "guarda", "aspetta", "porta", "legge", "trova", "prepara", "chiama", "apre", "cerca", "ama",
         "vende"],
        ["il pane", "la casa", "una lettera", "il giornale", "la porta", "un libro", "la macchina", "il treno",
         "una canzone", "il giardino", "la finestra", "il mercato"],
    ),
    "ca": (
        ["jo", "nosaltres", "el mestre", "la mare", "el noi", "la senyora", "els amics", "el pare", "el metge",
         "la nena", "tothom", "el vei"],
        ["compra", "mira", "espera", "porta", "llegeix", "troba", "prepara", "crida", "obre", "busca", "vol",
         "ven"],
        ["el pa", "la casa", "una carta", "el diari", "la porta", "un llibre", "el cotxe", "el tren", "una canco",
         "el jardi", "la finestra", "el mercat"],
    ),
    "cs": (
        ["ja", "my", "ucitel", "moje matka", "ten kluk", "pani", "kamaradi", "muj otec", "doktor", "holka",
         "vsichni", "soused"],
        ["koupil", "vidi", "ceka na", "nese", "cte", "nasel", "pripravil", "vola", "otevrel", "hleda", "ma rad",
         "prodal"],
        ["chleba", "dum", "dopis", "noviny", "dvere", "knihu", "auto", "vlak", "pisnicku", "zahradu", "okno",
         "kolo"],
    ),
    "fi": (
        ["mina", "me", "opettaja", "aiti", "poika", "rouva", "ystavat", "isa", "laakari", "tytto", "kaikki",
         "naapuri"],
        ["ostaa", "katsoo", "odottaa", "tuo", "lukee", "loytaa", "tekee", "soittaa", "avaa", "etsii", "rakastaa",
         "myy"],
        ["leipaa", "talon", "kirjeen", "lehden", "oven", "kirjan", "auton", "junan", "laulun", "puutarhan",
         "ikkunan", "kalan"],
    ),
    "ru": (
        ["я", "мы", "учитель", "моя мама", "мальчик", "соседка", "друзья", "мой отец", "врач", "девочка", "все",
         "сосед"],
        ["покупает", "смотрит", "ждёт", "несёт", "читает", "находит", "готовит", "зовёт", "открывает", "ищет",
         "любит", "продаёт"],
        ["хлеб", "дом", "письмо", "газету", "дверь", "книгу", "машину", "поезд", "песню", "сад", "окно", "рыбу"],
    ),
}
_TAILS: dict[str, list[str]] = {
    "en": ["today", "this morning", "after lunch", "every day", "last week", "in the evening", "again", "at home"],
    "it": ["oggi", "domani", "ogni giorno", "stasera", "adesso", "sempre"],
    "ca": ["avui", "dema", "cada dia", "aquesta nit", "ara", "sempre"],
    "cs": ["dnes", "zitra", "kazdy den", "vecer", "ted", "vzdy"],
    "fi": ["tanaan", "huomenna", "joka paiva", "illalla", "nyt", "aina"],
    "ru": ["сегодня", "завтра", "каждый день", "вечером", "сейчас", "всегда"],
}
LANGUAGES = ("zh", *_WORDS)
HELD_OUT_SHARE = 0.15


@cache
def clause_split(lang: str, seed: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(training clauses, held-out clauses) of a language: a seeded shuffle, the held-out share first."""
    if lang == "zh":
        pool = clause_pool()
    else:
        subj, verb, obj = _WORDS[lang]
        pool = [f"{s} {v} {o}" for s, v, o in itertools.product(subj, verb, obj)]
        pool += [f"{s} {v} {o} {t}" for (s, v, o), t in zip(itertools.product(subj[::2], verb[::3], obj[::2]),
                                                               itertools.cycle(_TAILS[lang]))]
        pool = sorted(set(pool))
    random.Random(f"{seed}/clauses/{lang}").shuffle(pool)
    n = round(HELD_OUT_SHARE * len(pool))
    return tuple(pool[n:]), tuple(pool[:n])


def units(text: str, lang: str) -> int:
    """Length in the language's units: characters for Chinese, words otherwise."""
    return n_spoken(text) if lang == "zh" else len(text.split())


# Lengths per bucket, in units (Chinese characters; words elsewhere, about 1.5 syllables each).
BUCKETS_ZH = ((4, 8), (9, 20), (21, 40))
BUCKETS_WORDS = ((2, 5), (6, 13), (14, 26))


def sentence(rng: random.Random, lang: str, clauses: tuple[str, ...], bucket: int) -> list[str]:
    """A sentence as its clauses (the caller joins them, with pauses or punctuation), of a length
    drawn uniformly in length bucket `bucket` (0, 1, 2)."""
    lo, hi = (BUCKETS_ZH if lang == "zh" else BUCKETS_WORDS)[bucket]
    target = rng.randint(lo, hi)
    for _ in range(400):
        parts, n = [], 0
        while n < target:
            c = rng.choice(clauses)
            if n + units(c, lang) > hi:
                if parts:
                    break
                continue
            parts.append(c)
            n += units(c, lang)
        if lo <= n <= hi:
            return parts
    # short buckets in languages whose clauses are long: cut a clause to its first words
    words = rng.choice(clauses).split()
    return [" ".join(words[:max(lo, min(hi, len(words)))])]


def join(parts: list[str], lang: str) -> str:
    """One utterance from clauses, with the language's comma and full stop."""
    if lang == "zh":
        return "，".join(parts) + "。"
    return ", ".join(parts) + "."
