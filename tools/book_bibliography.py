"""A Sphinx extension of the book: the bibliography's labels match the citations in the text.

The text cites author-year (``bibtex_reference_style: author_year``: "Williams et al., 2009"),
but pybtex's stock styles label the list alphabetically ("[WWP09]") or by number, so a reader
cannot match a citation to its entry. This registers a pybtex style, ``author_year``, whose
labels read "Williams et al. 2009"; ``_config.yml`` selects it with ``bibtex_default_style``.
"""

from __future__ import annotations

from pybtex.plugin import register_plugin
from pybtex.style.formatting.unsrt import Style as UnsortedStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting.author_year_title import SortingStyle


def _surname(person) -> str:
    name = " ".join(person.last_names) or " ".join(person.first_names)
    return name.replace("{", "").replace("}", "")


def author_year_label(entry) -> str:
    """"Surname Year", "Surname and Other Year" or "Surname et al. Year"; the organisation
    (or the title's first words) where an entry has no author."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    year = entry.fields.get("year", "n.d.")
    if not people:
        who = entry.fields.get("organization") or entry.fields.get("publisher")
        who = who or " ".join(entry.fields.get("title", "Anonymous").split()[:3])
        return f"{who.strip('{}')} {year}"
    if len(people) > 1 and _surname(people[-1]) == "others":
        return f"{_surname(people[0])} et al. {year}"
    if len(people) == 1:
        return f"{_surname(people[0])} {year}"
    if len(people) == 2:
        return f"{_surname(people[0])} and {_surname(people[1])} {year}"
    return f"{_surname(people[0])} et al. {year}"


class AuthorYearLabels(BaseLabelStyle):
    def format_labels(self, sorted_entries):
        """Labels in list order; two entries with one label become "... 2026a", "... 2026b"."""
        entries = list(sorted_entries)
        labels = [author_year_label(entry) for entry in entries]
        seen: dict[str, int] = {}
        for label in labels:
            if labels.count(label) == 1:
                yield label
                continue
            seen[label] = seen.get(label, 0) + 1
            yield f"{label}{'abcdefghijklmnopqrstuvwxyz'[seen[label] - 1]}"


class AuthorYearStyle(UnsortedStyle):
    default_label_style = AuthorYearLabels
    default_sorting_style = SortingStyle


def setup(app):
    register_plugin("pybtex.style.formatting", "author_year", AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
