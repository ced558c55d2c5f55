"""Caption cleaning before a T5 text encoder, as LlamaGen's text-to-image pipeline does it.

Its models were trained on captions lower-cased and stripped of URLs, HTML, @handles and stray
punctuation, with whitespace normalised, the whole pass applied twice; a prompt that skips this gets
different T5 features than the model saw.  Written from that description: the same steps, not the
original code.
"""

from __future__ import annotations

import html
import re
import urllib.parse

_URL = re.compile(r"\b(?:https?://|www\.)\S+|\b[\w.-]+\.(?:com|net|org|edu|gov|io|co|ru|it|de|uk)\b(?:/\S*)?")
_HTML_TAG = re.compile(r"<[^<>]*>")
_HANDLE = re.compile(r"@\w+")
_DASHES = re.compile(r"[\u2010-\u2015\u2212\ufe58\ufe63\uff0d]")
_DOUBLE_QUOTES = re.compile(r"[`´«»“”„¨]")
_SINGLE_QUOTES = re.compile(r"[‘’‚]")
_REPEATED_QUOTES = re.compile(r"[\"']{2,}")
_ELLIPSIS = re.compile(r"\.{2,}|…")
# symbols that carry no meaning for the image: hashes, trademarks, brackets, slashes, asterisks ...
_STRAY_SYMBOLS = re.compile(r"[#®•©™&@·º½¾¿¡§~()\[\]{}|\\/*]+")
_LONE_DOT = re.compile(r"\s+\.\s+")
_WORD_JOINERS = re.compile(r"[-_]")  # this-is-my-cute-cat, this_is_my_cute_cat
_WHITESPACE = re.compile(r"\s+")
_WRAPPING_QUOTES = re.compile(r"^[\"']([\s\S]+)[\"']$")
_LEADING_PUNCTUATION = re.compile(r"^[',_\-:;]+")
_TRAILING_PUNCTUATION = re.compile(r"[',_\-:+]+$")


def _clean_once(text: str) -> str:
    text = urllib.parse.unquote_plus(str(text)).strip().lower()
    text = html.unescape(html.unescape(text))
    text = _HTML_TAG.sub(" ", text)
    text = _URL.sub("", text)
    text = _HANDLE.sub("", text)
    text = text.replace("\\n", " ")  # a literal backslash-n left over from scraped captions
    text = _DASHES.sub("-", text)
    text = _DOUBLE_QUOTES.sub('"', text)
    text = _SINGLE_QUOTES.sub("'", text)
    text = _REPEATED_QUOTES.sub('"', text)
    text = _ELLIPSIS.sub(" ", text)
    text = _STRAY_SYMBOLS.sub(" ", text)
    text = _LONE_DOT.sub(" ", text)
    if len(_WORD_JOINERS.findall(text)) > 3:
        text = _WORD_JOINERS.sub(" ", text)
    text = _WHITESPACE.sub(" ", text).strip()
    text = _WRAPPING_QUOTES.sub(r"\1", text)
    text = _LEADING_PUNCTUATION.sub("", text)
    text = _TRAILING_PUNCTUATION.sub("", text)
    return text.strip()


def clean_caption(text: str) -> str:
    """The caption as the T5 encoder saw it in training (two cleaning passes, like the original)."""
    return _clean_once(_clean_once(text))
