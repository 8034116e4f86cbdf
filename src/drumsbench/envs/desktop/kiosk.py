"""The window manager's configuration in every desktop instance (``Settings.wm_kiosk``, on by default).

openbox's stock configuration gives any GUI-only policy one-key ways to hide LibreOffice while it
runs: ``super+d`` shows the desktop, every title bar has a minimise button, ``alt+space`` opens a
window menu with Iconify, alt+drag moves a window off the screen, a right click on the desktop opens
a menu whose "Exit" ends the window manager. A hidden window leaves a black screen — which a naive
harness scores as its own fault (invalid), so one key press would turn a 0 into no score at all.

The kiosk configuration takes all of them away: no key or mouse bindings, no root menu, title bars
with the title alone (no buttons; the same height, so a task's clicks land where they did), one
desktop. LibreOffice's own keys and dialogs are
untouched. The file is written by the harness (root's, 0644) into the instance's folder before
openbox starts and named with ``--config-file``; openbox reads it once, at start, before the policy
acts.
"""

from __future__ import annotations

FILE_NAME = ".drumsbench-openbox.xml"

RC_XML = """<?xml version="1.0" encoding="UTF-8"?>
<openbox_config xmlns="http://openbox.org/3.4/rc">
  <resistance><strength>0</strength><screen_edge_strength>0</screen_edge_strength></resistance>
  <focus><focusNew>yes</focusNew><followMouse>no</followMouse></focus>
  <placement><policy>Smart</policy></placement>
  <theme><titleLayout>L</titleLayout></theme>
  <desktops><number>1</number></desktops>
  <keyboard></keyboard>
  <mouse></mouse>
  <menu></menu>
  <applications>
    <application class="*"><iconic>no</iconic></application>
  </applications>
</openbox_config>
"""
