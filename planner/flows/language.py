"""Which language a screen (or a learned flow's recorded labels) is in, roughly: enough to tell
a flow learned on an English phone from a German phone's screen.

A flow finds its elements again by their labels, and another language's labels are not the
same labels (`planner.targets.resolve`): on a phone set to another language every replay hands
over. That is the phone's setting, not a changed app: counted as divergences, three such phones
retired the flow for every phone. The observation carries no locale, so the language is read
from the texts: the writing system first (Cyrillic, Greek, Arabic, Hebrew, Han, kana, Hangul,
Thai, Devanagari), then, for Latin script, common interface words per language. It answers only
when the texts say so clearly ("" otherwise), so a doubt leaves the replay as it was.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable

from amc.v1 import types_pb2


def _vocab(words: str) -> frozenset[str]:
    """A language's words, written as one string to keep the table short."""
    return frozenset(words.split())


#: Common interface and function words per language. Words most languages share ("internet",
#: "bluetooth", "apps") are in no list; one two languages share counts for both.
_WORDS: dict[str, frozenset[str]] = {
    "English": _vocab(
        "about accounts allow and back battery brightness calculator camera clock connected"
        " contacts dark devices display for friday home location messages mode monday more"
        " navigate network notes notifications of off open options phone privacy saturday"
        " screen search security settings sound storage sunday system the theme thursday to"
        " tuesday turn up wallpaper wednesday with your"
    ),
    "German": _vocab(
        "akku anzeige aus benachrichtigungen bildschirm das datenschutz dein deine der die"
        " dienstag donnerstag dunkles einstellungen freitag für geräte helligkeit hintergrund"
        " kamera kontakte konten mit mittwoch montag nach nachrichten netzwerk nicht notizen"
        " oben optionen rechner samstag sicherheit sonntag speicher standort startbildschirm"
        " suchen telefon ton uhr und verbunden von weitere zu zulassen zurück öffnen über"
    ),
    "French": _vocab(
        "accueil affichage appareil appareils autoriser avec batterie calculatrice comptes"
        " confidentialité connectés des dimanche du et fond horloge jeudi les localisation"
        " luminosité lundi mardi mercredi ouvrir paramètres photo pour propos rechercher"
        " retour réseau samedi sombre son stockage sécurité thème téléphone vendredi votre"
        " écran"
    ),
    "Spanish": _vocab(
        "abrir acerca ajustes almacenamiento atrás batería brillo buscar calculadora con"
        " conectados configuración contactos cuentas cámara del dispositivos domingo el inicio"
        " jueves las los lunes martes miércoles notificaciones oscuro pantalla para permitir"
        " privacidad red reloj seguridad sonido sábado teléfono tema tu ubicación viernes y"
    ),
    "Italian": _vocab(
        "account apri batteria calcolatrice cerca con connessi consenti contatti della"
        " dispositivi domenica fotocamera giovedì gli il impostazioni indietro informazioni"
        " luminosità lunedì martedì memoria mercoledì notifiche orologio per posizione rete"
        " sabato schermo scuro sfondo sicurezza suono telefono tuo venerdì"
    ),
    "Portuguese": _vocab(
        "abrir armazenamento bateria brilho calculadora com conectados configurações contas"
        " contatos câmera da definições dispositivos do domingo ecrã escuro início localização"
        " notificações os para permitir pesquisar privacidade quarta quinta rede relógio"
        " segunda segurança seu sexta sobre som sábado tela telefone terça voltar"
    ),
}
#: Scripts other than Latin, by the first word of a letter's Unicode name.
_SCRIPTS = {
    "CYRILLIC": "Cyrillic script",
    "GREEK": "Greek",
    "ARABIC": "Arabic script",
    "HEBREW": "Hebrew",
    "CJK": "Chinese script",
    "HIRAGANA": "Japanese",
    "KATAKANA": "Japanese",
    "HANGUL": "Korean",
    "THAI": "Thai",
    "DEVANAGARI": "Devanagari script",
}
_WORD = re.compile(r"[^\W\d_]+")


def _script(letter: str) -> str:
    name = unicodedata.name(letter, "")
    return _SCRIPTS.get(name.split(" ", 1)[0], "Latin" if "LATIN" in name else "")


def guess(texts: Iterable[str]) -> str:
    """The language (or non-Latin script) `texts` are in, or "" when they do not say clearly:
    most of the letters in one script other than Latin; else at least two words of one
    language's list and more than twice as many as any other's."""
    joined = " ".join(texts)
    scripts = Counter(s for s in map(_script, filter(str.isalpha, joined)) if s)
    if not scripts:
        return ""
    script, letters = scripts.most_common(1)[0]
    if script != "Latin":
        japanese = scripts["Japanese"] and script == "Chinese script"
        return "Japanese" if japanese else script if letters * 2 > scripts.total() else ""
    words = [w.lower() for w in _WORD.findall(joined)]
    hits = sorted(((sum(w in vocab for w in words), lang) for lang, vocab in _WORDS.items()))
    (runner_up, _), (best, language) = hits[-2], hits[-1]
    return language if best >= 2 and best > 2 * runner_up else ""


def says(text: str, language: str) -> bool:
    """`text` holds a word of `language`'s list that no other language's list holds ("Notes"
    is English; "Bluetooth", in no list, says nothing)."""
    own = _WORDS.get(language, frozenset())
    others = set().union(*(v for k, v in _WORDS.items() if k != language))
    return any(w in own and w not in others for w in (w.lower() for w in _WORD.findall(text)))


def of_flow(flow: types_pb2.Flow) -> str:
    """The language of what a flow recorded of its screens: its pages' titles and its targets'
    labels (not its purposes or outcomes: the model wrote those, in its own language)."""
    texts: list[str] = []
    for step in flow.steps:
        for page in (step.page_before, step.page_after):
            texts.append(page.partition(": ")[2])
        if step.HasField("target"):
            t = step.target
            texts += [t.text, t.row_label, t.content_description, t.hint]
    return guess(texts)
