"""``asyncrl serve``: the built-in engine behind HTTP.

Two APIs on one port:

- SGLang's native API, the one AReaL's client speaks: ``POST /generate`` (``input_ids`` or ``text``,
  ``sampling_params``, ``return_logprob``), ``/pause_generation`` (``mode``: ``abort`` ends running requests
  with finish reason ``abort``, ``in_place`` holds them at a token boundary), ``/continue_generation``,
  ``/update_weights_from_disk``, ``/init_weights_update_group`` + ``/update_weights_from_distributed`` +
  ``/destroy_weights_update_group`` (the gloo transport of ``asyncrl.weights.publish``), ``GET /health``,
  ``/get_model_info``, ``/get_server_info``. Each ``/generate`` result also carries
  ``meta_info.output_token_versions``: the weight version of every output token.
- OpenAI's ``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models`` (no streaming).

A mistake in a request gets a 4xx naming the field (``app.py`` lists the codes); what one request may ask is
bounded (``limits.py``), and nothing it asks runs on the event loop for long, so ``/health`` always answers.
SIGTERM or SIGINT stops the server within seconds. It binds 127.0.0.1 unless told otherwise.

Modules: ``cli`` (flags, start-up; imports without the serve extra), ``limits``, ``schemas`` (request bodies),
``state`` (engine, tokenizer, weight receiver; checkpoint loading), ``app`` (routes, uvicorn), ``middleware``,
``render`` (response bodies). This package's ``__init__`` imports nothing, so ``cli`` stays light.
"""
