"""Task specifications: edits as (file, old, new) replacements, each old must occur exactly once."""

TASKS = []


def task(id, project, description, bug, wrong, golden=None):
    TASKS.append(dict(id=id, project=project, description=description, bug=bug, wrong=wrong,
                      golden=golden))


# ---------------------------------------------------------------- textstats
task(
    "textstats-top-words-ties", "textstats",
    """top_words() orders words that have the same count the wrong way round. The docstring says
ties are ordered alphabetically, but top_words("pear apple pear apple fig") returns
[('pear', 2), ('apple', 2), ('fig', 1)]. With a small n this also changes which words make the
cut, so our keyword report differs from the one our old tool produced.""",
    bug=[("textstats/stats.py",
          "        key=lambda item: (-item[1], item[0]),\n    )\n",
          "        key=lambda item: (item[1], item[0]),\n        reverse=True,\n    )\n")],
    wrong=[[("textstats/stats.py",
             """    ranked = sorted(
        ((word, count) for word, count in freq.items() if word not in stop),
        key=lambda item: (item[1], item[0]),
        reverse=True,
    )
    return ranked[:n]
""",
             """    kept = Counter({word: count for word, count in freq.items() if word not in stop})
    return kept.most_common(n)
""")]],
)

task(
    "textstats-stopwords-case", "textstats",
    """Stopwords passed to top_words() are only honoured when they are written in lower case.
top_words(text, stopwords=["The", "And"]) still lists "the" and "and" among the top words,
although the docstring says stopwords are matched case-insensitively. Our stopword lists are
copied from a style guide, so they contain entries such as "The" and "Don’t".""",
    bug=[("textstats/stats.py",
          "    stop = {normalize(word) for word in stopwords}\n",
          "    stop = set(stopwords)\n")],
    wrong=[[("textstats/stats.py",
             "    stop = set(stopwords)\n",
             "    stop = {word.lower() for word in stopwords}\n")]],
)

task(
    "textstats-truncate-width", "textstats",
    """truncate() returns strings longer than the width it is given:
truncate("Hello brave new world", 10) returns 'Hello brav…', which is 11 characters. The
columns of our fixed-width table report are pushed out of alignment wherever a value had to be
shortened.""",
    bug=[("textstats/wrap.py",
          "    return collapsed[: width - len(placeholder)].rstrip() + placeholder\n",
          "    return collapsed[:width].rstrip() + placeholder\n")],
    wrong=[[("textstats/wrap.py",
             "    return collapsed[:width].rstrip() + placeholder\n",
             "    return collapsed[: width - 1].rstrip() + placeholder\n")]],
)

task(
    "textstats-sentence-tail", "textstats",
    """The last sentence goes missing when a text does not end with punctuation.
sentences("Meeting moved. See you at 3") returns only ['Meeting moved.'], and
count_sentences("Untitled draft") is 0. Chat messages and titles rarely end with a period, so
our sentence counts and average_sentence_length() are off for most of our data.""",
    bug=[("textstats/tokenize.py",
          """        start = match.end()
    tail = text[start:].strip()
    if tail:
        found.append(tail)
    return found
""",
          """        start = match.end()
    return found
""")],
    wrong=[[("textstats/tokenize.py",
             """        start = match.end()
    return found
""",
             """        start = match.end()
    if start < len(text):
        found.append(text[start:].strip())
    return found
""")]],
)

task(
    "textstats-empty-summary", "textstats",
    """summary() crashes with ZeroDivisionError on an empty document; we hit it when a user
uploaded an empty file. The docstring says any text is accepted and that an empty document
gives zero counts and 0.0 averages.""",
    bug=[("textstats/stats.py",
          """    tokens = words(text)
    if not tokens:
        return 0.0
    return sum(len(token) for token in tokens) / len(tokens)
""",
          """    tokens = words(text)
    return sum(len(token) for token in tokens) / len(tokens)
"""),
         ("textstats/stats.py",
          """    found = sentences(text)
    if not found:
        return 0.0
    return""",
          """    found = sentences(text)
    return"""),
         ("textstats/stats.py",
          """    tokens = words(text)
    if not tokens:
        return 0.0
    words_per_sentence""",
          """    tokens = words(text)
    words_per_sentence""")],
    wrong=[[("textstats/stats.py",
             """    Any text is accepted: an empty document gives zero counts and 0.0 averages.
    \"\"\"
    return Summary(
""",
             """    Any text is accepted: an empty document gives zero counts and 0.0 averages.
    \"\"\"
    if not text:
        return Summary(0, 0, 0.0, 0.0, 0.0)
    return Summary(
""")]],
)

# ---------------------------------------------------------------- invoice
task(
    "invoice-rounding-mode", "invoice",
    """Cent rounding does not match our accounting system. A line of 10.50 with 5 % tax shows a
tax of 0.52, while our ledger (and the invoice.money docstring) says 0.53, and
to_money("0.125") returns 0.12. It does not happen for every amount: to_money("0.135") gives
0.14 as expected.""",
    bug=[("invoice/money.py",
          "from decimal import ROUND_HALF_UP, Decimal, InvalidOperation\n",
          "from decimal import Decimal, InvalidOperation\n"),
         ("invoice/money.py",
          "    return Decimal(value).quantize(CENT, rounding=ROUND_HALF_UP)\n",
          "    return Decimal(value).quantize(CENT)\n")],
    wrong=[
        [("invoice/money.py",
          "from decimal import Decimal, InvalidOperation\n",
          "from decimal import ROUND_UP, Decimal, InvalidOperation\n"),
         ("invoice/money.py",
          "    return Decimal(value).quantize(CENT)\n",
          "    return Decimal(value).quantize(CENT, rounding=ROUND_UP)\n")],
        [("invoice/money.py",
          "from decimal import Decimal, InvalidOperation\n",
          "from decimal import ROUND_CEILING, Decimal, InvalidOperation\n"),
         ("invoice/money.py",
          "    return Decimal(value).quantize(CENT)\n",
          "    return Decimal(value).quantize(CENT, rounding=ROUND_CEILING)\n")],
    ],
)

task(
    "invoice-shared-items", "invoice",
    """Line items leak from one invoice into the next. Our billing job creates one Invoice per
customer without initial items and fills it with add_item(); from the second customer on, the
new invoice already contains the line items of all the previous customers.""",
    bug=[("invoice/models.py",
          "from collections.abc import Iterable\nfrom dataclasses import dataclass\n",
          "from dataclasses import dataclass\n"),
         ("invoice/models.py",
          "        items: Iterable[LineItem] | None = None,\n",
          "        items: list[LineItem] = [],\n"),
         ("invoice/models.py",
          "        self.items: list[LineItem] = list(items) if items is not None else []\n",
          "        self.items: list[LineItem] = items\n")],
    wrong=[[("invoice/models.py",
             "        items: list[LineItem] = [],\n",
             "        items: list[LineItem] | None = None,\n"),
            ("invoice/models.py",
             "        self.items: list[LineItem] = items\n",
             "        self.items: list[LineItem] = items or []\n")]],
)

task(
    "invoice-allocate-remainder", "invoice",
    """allocate() loses or invents cents. Splitting a 100.00 bill three ways gives
[33.33, 33.33, 33.33], which adds up to 99.99, and splitting 0.02 three ways gives three times
0.01. The shares must always add up to exactly the amount, as the docstring promises.""",
    bug=[("invoice/money.py",
          """    cents = int(to_money(amount) * 100)
    base, remainder = divmod(cents, parts)
    return [Decimal(base + (1 if i < remainder else 0)).scaleb(-2) for i in range(parts)]
""",
          """    share = to_money(to_money(amount) / parts)
    return [share] * parts
""")],
    wrong=[[("invoice/money.py",
             """    share = to_money(to_money(amount) / parts)
    return [share] * parts
""",
             """    total = to_money(amount)
    share = to_money(total / parts)
    # The last share absorbs the rounding difference so that the shares add up.
    return [share] * (parts - 1) + [total - share * (parts - 1)]
""")]],
)

task(
    "invoice-csv-quoting", "invoice",
    """to_csv() writes broken CSV when a line item's description contains a comma. The row for a
"Cable, 2 m" item has seven columns instead of six, spreadsheet programs shift the remaining
values into the wrong columns, and from_csv() on the exported text raises ValueError instead
of giving back the same invoice.""",
    bug=[("invoice/export.py",
          """    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\\n")
    writer.writerow(FIELDS)
    for item in invoice.items:
        writer.writerow(
            [
                item.description,
                str(item.quantity),
                str(item.unit_price),
                str(item.tax_rate),
                str(item.discount),
                str(item.total),
            ]
        )
    return buffer.getvalue()
""",
          """    lines = [",".join(FIELDS)]
    for item in invoice.items:
        values = [
            item.description,
            str(item.quantity),
            str(item.unit_price),
            str(item.tax_rate),
            str(item.discount),
            str(item.total),
        ]
        lines.append(",".join(values))
    return "\\n".join(lines) + "\\n"
""")],
    wrong=[[("invoice/export.py",
             """        values = [
            item.description,
""",
             """        description = item.description
        if "," in description:
            description = f'"{description}"'
        values = [
            description,
""")]],
)

task(
    "invoice-csv-price-precision", "invoice",
    """Exporting and re-importing an invoice changes its total. We bill API calls at fractions of
a cent: a line of 1 x 0.145 has a total of 0.15 on the original invoice, but 0.14 after a
round trip through to_csv() and from_csv(). The exported file shows a unit price of 0.14.""",
    bug=[("invoice/export.py",
          "                str(item.unit_price),\n",
          "                f\"{item.unit_price:.2f}\",\n"),
         ("invoice/export.py",
          "                str(item.total),\n",
          "                f\"{item.total:.2f}\",\n")],
    wrong=[[("invoice/export.py",
             "from invoice.models import Invoice, LineItem\n",
             "from invoice.models import Invoice, LineItem\nfrom invoice.money import to_money\n"),
            ("invoice/export.py",
             "                f\"{item.unit_price:.2f}\",\n",
             "                str(to_money(item.unit_price)),\n")]],
)

# ---------------------------------------------------------------- intervals
task(
    "intervals-merge-touching", "intervals",
    """merge() does not join back-to-back intervals. Two meetings 09:00-10:00 and 10:00-11:00 come
back as two separate intervals instead of one 09:00-11:00 block, so our calendar view shows a
break where there is none. The merge() docstring says intervals that touch are combined.""",
    bug=[("intervals/interval.py",
          "        if merged and current.start <= merged[-1].end:\n",
          "        if merged and merged[-1].overlaps(current):\n")],
    wrong=[[("intervals/interval.py",
             "        return self.start < other.end and other.start < self.end\n",
             "        return self.start <= other.end and other.start <= self.end\n")]],
)

task(
    "intervals-utc-normalize", "intervals",
    """Intervals written with a UTC offset end up at the wrong time.
Interval.parse("2024-05-01T09:00:00+02:00/2024-05-01T10:00:00+02:00") prints as
2024-05-01T09:00:00Z/2024-05-01T10:00:00Z, two hours late, so it does not overlap a meeting
that starts at 07:30Z although the two clearly collide.""",
    bug=[("intervals/interval.py",
          """    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)
""",
          """    return moment.replace(tzinfo=timezone.utc)
""")],
    wrong=[[("intervals/interval.py",
             """    return moment.replace(tzinfo=timezone.utc)
""",
             """    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment
""")]],
)

task(
    "intervals-duration-negative", "intervals",
    """format_duration() produces invalid output for negative durations:
format_duration(timedelta(minutes=-90)) returns 'P-1DT22H30M', which is not ISO 8601, and
parse_duration() rejects it. We store clock corrections, which are often negative, and cannot
read them back.""",
    bug=[("intervals/duration.py",
          """    if delta < timedelta(0):
        return "-" + format_duration(-delta)
    hours, rest""",
          """    hours, rest""")],
    wrong=[[("intervals/duration.py",
             """    \"\"\"
    hours, rest = divmod(delta.seconds, 3600)
""",
             """    \"\"\"
    delta = abs(delta)
    hours, rest = divmod(delta.seconds, 3600)
""")]],
)

task(
    "intervals-duration-fraction", "intervals",
    """parse_duration() rejects durations with a fractional part. Our media files report lengths
such as 'PT0.5S' or 'PT2.75S', and parse_duration() raises ValueError for them, although the
module docstring says that fractions are supported.""",
    bug=[("intervals/duration.py",
          "_NUM = r\"\\d+(?:[.,]\\d+)?\"\n",
          "_NUM = r\"\\d+\"\n")],
    wrong=[[("intervals/duration.py",
             "_NUM = r\"\\d+\"\n",
             "_NUM = r\"\\d+(?:\\.\\d+)?\"\n")]],
)

task(
    "intervals-business-days-end", "intervals",
    """business_days_between() counts one day too many. From Monday 2024-03-04 to Friday
2024-03-08 it returns 5, but the range is documented as half-open (the end date is not
counted), so it should be 4; from a Monday to the next Monday it returns 6 instead of 5.
Our SLA reports overstate the elapsed business days because of this.""",
    bug=[("intervals/business.py",
          "    while day < end:\n",
          "    while day <= end:\n")],
    wrong=[
        [("intervals/business.py",
          "    day = start\n",
          "    day = start + _DAY\n")],
        [("intervals/business.py",
          "    return count\n",
          "    return max(count - 1, 0)\n")],
    ],
)
