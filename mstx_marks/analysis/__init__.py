"""Reading what was recorded, at cluster scale: :mod:`.readers` for every trace format,
:mod:`.steps` and :mod:`.aggregate` to reduce them, :mod:`.summary` for the table, :mod:`.merge`
for one Perfetto trace of the job, :mod:`.timeline` and :mod:`.report_html` for pictures, and
:mod:`.coverage` for the phases a run never emitted. Depends on the record types only.
"""
