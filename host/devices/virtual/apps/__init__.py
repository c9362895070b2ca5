"""The apps installed on a virtual phone: launcher, Settings, Contacts, Clock and Calculator."""
