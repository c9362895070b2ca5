"""What the phone's screens say in each locale: English (the keys) and German.

Apps write their English strings through `Strings.tr`; a German phone shows the translation,
as a real phone shows each app's `values-de` resources. Settings values keep their English
names in `PhoneState` (what checkers read); only what is drawn and dumped is translated.
"""

from __future__ import annotations

from dataclasses import dataclass

LOCALES = ("en-US", "de-DE")

_DE: dict[str, str] = {
    # system UI
    "Back": "Zurück",
    "Home": "Startbildschirm",
    "Overview": "Übersicht",
    "Battery {0} percent.": "Akku: {0} Prozent.",
    "Wifi signal full.": "WLAN: volle Signalstärke.",
    "No internet.": "Kein Internet.",
    "Phone signal full.": "Mobilfunk: volle Signalstärke.",
    "Airplane mode.": "Flugmodus.",
    "Sunday, Nov 29": "Sonntag, 29. Nov.",
    "Notifications": "Benachrichtigungen",
    "No notifications": "Keine Benachrichtigungen",
    "Manage": "Verwalten",
    "Clear all": "Alle löschen",
    "USB debugging connected": "USB-Debugging verbunden",
    "Tap to turn off USB debugging": "Zum Deaktivieren von USB-Debugging tippen",
    "Android System": "Android-System",
    "Internet": "Internet",
    "Bluetooth": "Bluetooth",
    "Airplane mode": "Flugmodus",
    "Dark theme": "Dunkles Design",
    "Battery Saver": "Energiesparmodus",
    "Do Not Disturb": "Bitte nicht stören",
    "Location": "Standort",
    "Auto-rotate": "Automatisch drehen",
    "Open settings": "Einstellungen öffnen",
    "Edit": "Bearbeiten",
    "Power menu": "Ein/Aus-Menü",
    "On": "An",
    "Off": "Aus",
    "Swipe up to unlock": "Zum Entsperren nach oben wischen",
    "Unlock": "Entsperren",
    "Enter PIN": "PIN eingeben",
    "Emergency call": "Notruf",
    # dialogs
    "Allow {0} to send you notifications?": "{0} erlauben, dir Benachrichtigungen zu senden?",
    "Allow {0} to access your contacts?": "{0} Zugriff auf deine Kontakte erlauben?",
    "Allow {0} to access this device’s location?": (
        "{0} Zugriff auf den Standort dieses Geräts erlauben?"
    ),
    "Allow": "Zulassen",
    "Don’t allow": "Nicht zulassen",
    "{0} isn't responding": "{0} reagiert nicht",
    "Close app": "App schließen",
    "Wait": "Warten",
    "App info": "App-Info",
    # launcher
    "Search": "Suchen",
    "Voice search": "Sprachsuche",
    "Google Lens": "Google Lens",
    "Page 1 of 1": "Seite 1 von 1",
    "Apps list": "Liste der Apps",
    "Phone": "Telefon",
    "Messages": "Nachrichten",
    "Chrome": "Chrome",
    "Camera": "Kamera",
    "Settings": "Einstellungen",
    "Contacts": "Kontakte",
    "Clock": "Uhr",
    "Calculator": "Rechner",
    "Notes": "Notizen",
    "Nothing here yet.": "Hier ist noch nichts.",
    # settings
    "Search settings": "In Einstellungen suchen",
    "Navigate up": "Nach oben",
    "More options": "Weitere Optionen",
    "Network & internet": "Netzwerk & Internet",
    "Wi-Fi, mobile, data usage, hotspot": "WLAN, Mobilfunk, Datennutzung, Hotspot",
    "Connected devices": "Verbundene Geräte",
    "Bluetooth, pairing": "Bluetooth, Kopplung",
    "Apps": "Apps",
    "Recent apps, default apps": "Zuletzt verwendete Apps, Standard-Apps",
    "Notification history, conversations": "Benachrichtigungsverlauf, Unterhaltungen",
    "Battery": "Akku",
    "Storage": "Speicher",
    "37% used - 81 GB free": "37 % belegt – 81 GB frei",
    "Sound & vibration": "Ton & Vibration",
    "Volume, haptics, Do Not Disturb": "Lautstärke, Haptik, Bitte nicht stören",
    "Display": "Display",
    "Dark theme, font size, brightness": "Dunkles Design, Schriftgröße, Helligkeit",
    "Wallpaper & style": "Hintergrund & Stil",
    "Colors, themed icons, app grid": "Farben, Designsymbole, App-Raster",
    "Accessibility": "Bedienungshilfen",
    "Display, interaction, audio": "Display, Interaktion, Audio",
    "Security & privacy": "Sicherheit & Datenschutz",
    "App security, device lock": "App-Sicherheit, Displaysperre",
    "Safety & emergency": "Sicherheit & Notfall",
    "Emergency SOS, medical info, alerts": "Notfall-SOS, medizinische Infos, Warnungen",
    "Passwords & accounts": "Passwörter & Konten",
    "Saved passwords, autofill, accounts": "Gespeicherte Passwörter, Autofill, Konten",
    "Digital Wellbeing": "Digitales Wohlbefinden",
    "Screen time, app timers, bedtime": "Bildschirmzeit, App-Timer, Schlafenszeit",
    "System": "System",
    "Languages, gestures, time, backup": "Sprachen, Gesten, Zeit, Sicherung",
    "About phone": "Über das Telefon",
    "Tips & support": "Tipps & Support",
    "Help articles, phone and chat": "Hilfeartikel, Telefon und Chat",
    "Nothing to change on this page.": "Auf dieser Seite gibt es nichts zu ändern.",
    "Wi-Fi": "WLAN",
    "HomeNetwork": "HomeNetwork",
    "Mobile network": "Mobilfunknetz",
    "Virtual Mobile": "Virtual Mobile",
    "Hotspot & tethering": "Hotspot & Tethering",
    "Data Saver": "Datensparmodus",
    "VPN": "VPN",
    "None": "Keine",
    "Pair new device": "Neues Gerät koppeln",
    "Connection preferences": "Verbindungseinstellungen",
    "NFC, Android Auto": "NFC, Android Auto",
    "Brightness": "Helligkeit",
    "Brightness level": "Helligkeitsstufe",
    "Adaptive brightness": "Automatische Helligkeit",
    "Lock display": "Sperrbildschirm",
    "Screen timeout": "Display automatisch ausschalten",
    "After {0} of inactivity": "Nach {0} Inaktivität",
    "Appearance": "Darstellung",
    "Font size": "Schriftgröße",
    "Auto-rotate screen": "Display automatisch drehen",
    "Small": "Klein",
    "Default": "Standard",
    "Large": "Groß",
    "Largest": "Am größten",
    "15 seconds": "15 Sekunden",
    "30 seconds": "30 Sekunden",
    "1 minute": "1 Minute",
    "2 minutes": "2 Minuten",
    "5 minutes": "5 Minuten",
    "10 minutes": "10 Minuten",
    "30 minutes": "30 Minuten",
    "Media volume": "Medienlautstärke",
    "Vibrate for calls": "Bei Anrufen vibrieren",
    "Phone ringtone": "Klingelton",
    "Virtual Bells": "Virtual Bells",
    "Battery level": "Akkustand",
    "Battery percentage": "Akkustand in Prozent",
    "Battery usage": "Akkunutzung",
    " - Battery Saver on": " – Energiesparmodus an",
    "Use location": "Standort verwenden",
    "Recent access": "Letzter Zugriff",
    "On - 3 apps have access": "An – 3 Apps haben Zugriff",
    "TalkBack": "TalkBack",
    "Color inversion": "Farbumkehr",
    "Languages": "Sprachen",
    "English (United States)": "Deutsch (Deutschland)",
    "Gestures": "Gesten",
    "Date & time": "Datum & Uhrzeit",
    "Backup": "Sicherung",
    "Reset options": "Optionen zum Zurücksetzen",
    "Set time automatically": "Uhrzeit automatisch einstellen",
    "Use 24-hour format": "24-Stunden-Format verwenden",
    "Device name": "Gerätename",
    "Phone number": "Telefonnummer",
    "Unknown": "Unbekannt",
    "Model": "Modell",
    "Android version": "Android-Version",
    "Build number": "Build-Nummer",
    # contacts
    "Create contact": "Kontakt erstellen",
    "Save": "Speichern",
    "Cancel": "Abbrechen",
    "Delete": "Löschen",
    "Name": "Name",
    "No contacts yet": "Noch keine Kontakte",
    "No phone number": "Keine Telefonnummer",
    "Mobile": "Mobil",
    "Enter a name to save this contact": "Gib einen Namen ein, um den Kontakt zu speichern",
    "Search contacts": "Kontakte durchsuchen",
    # clock
    "Alarm": "Wecker",
    "Timer": "Timer",
    "Stopwatch": "Stoppuhr",
    "No alarms": "Keine Wecker",
    "Add alarm": "Wecker hinzufügen",
    "Alarm name": "Name des Weckers",
    "Delete {0} alarm": "Wecker um {0} löschen",
    "{0} alarm": "Wecker um {0}",
    "Alarm set for {0}": "Wecker gestellt für {0}",
    # calculator
    "clear": "löschen",
    "delete": "löschen",
    "percent": "Prozent",
    "divide": "geteilt durch",
    "multiply": "mal",
    "minus": "minus",
    "plus": "plus",
    "point": "Komma",
    "equals": "gleich",
    "Can't divide by 0": "Division durch 0 nicht möglich",
    "Bad expression": "Ungültiger Ausdruck",
    # notes
    "New note": "Neue Notiz",
    "No notes yet": "Noch keine Notizen",
    "Title": "Titel",
    "Note": "Notiz",
    "Discard": "Verwerfen",
    "Note saved": "Notiz gespeichert",
    "Search notes": "Notizen durchsuchen",
}

_TABLES: dict[str, dict[str, str]] = {"en-US": {}, "de-DE": _DE}


@dataclass(frozen=True)
class Strings:
    """One locale's strings."""

    locale: str = "en-US"

    def __post_init__(self) -> None:
        if self.locale not in _TABLES:
            raise ValueError(f"unknown locale {self.locale!r} (have {', '.join(LOCALES)})")

    @property
    def language(self) -> str:
        return self.locale.split("-", 1)[0]

    def tr(self, english: str, *args: object) -> str:
        """The string in this locale (English when there is no translation), formatted."""
        text = _TABLES[self.locale].get(english, english)
        return text.format(*args) if args else text
