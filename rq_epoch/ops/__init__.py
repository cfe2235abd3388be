"""What operators run: the command line (:mod:`.cli`, :mod:`.cli_config`), ``rq-epoch status``
(:mod:`.status`, :mod:`.history`, :mod:`.formatting`) and the exporter's metrics and page
(:mod:`.metrics`, :mod:`.page`, who may see the page: :mod:`.access`, its shared renders:
:mod:`.render_cache`). The top layer: it may use every other."""
