"""What people read, each drawn from the one model (:mod:`mstx_marks.analysis.model`): the
text, CSV and JSON tables, the HTML report, the SVG timeline and the merged trace."""
