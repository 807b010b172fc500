"""Reading what was recorded, at cluster scale, in three parts and two commands:
:mod:`.readers` reads every trace format (and a Ray cluster's nodes, and spills too large to hold)
into records; :mod:`.model` turns them into the one model behind every figure (steps, spans, the
per-step model, clock alignment, per-phase statistics); :mod:`.render` draws that model (the
text, CSV and JSON tables, the HTML report, the SVG timeline, the merged trace).
:mod:`.summary` and :mod:`.diff` are the two commands that tie them together. Depends on the
record types only, never on a backend.
"""
