"""Programs that run on every rank: they read one resolved spec, run, and write events.

They never compare, judge or report; that is the harness's job (see harness/).
"""
