"""The protocol: what rq-epoch keeps in the server, and the scripts that change it.

The lowest layer; it imports nothing from the others. :mod:`.epoch` is the rule (which
stalls count), :mod:`.verdicts` its outcomes, :mod:`.keys` every key name, :mod:`.scripts`
loads the Lua scripts in ``lua/`` (one per verb), :mod:`.verbs` calls each and reads its
reply into a typed value, :mod:`.server` reads the server's run_id and role (INFO), and
:mod:`.report` is the typed value of a sweep's reply.
"""
