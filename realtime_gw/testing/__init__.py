"""What tests and load scripts drive a gateway with (like ``starlette.testclient``; never imported by the
gateway itself):

- ``gateway``: ``start_server`` / ``stop_server``, a gateway subprocess on a free loopback port;
- ``load_client``: the raw, many-sessions realtime voice client of the load scripts;
- ``bystander``: a well-behaved neighbour that measures what something else costs it;
- ``audio``: real speech (Piper) and transcripts (pocketsphinx), and word error rate (``jiwer``,
  from the ``dev`` extra).

Import the module you need; this package imports none of them, so each costs only what it uses.
"""
