#!/usr/bin/env bash
# The OpenAI-SDK conformance of `lily serve` (server_conformance.sh) with the CPU backend drawing
# tokens itself, as the CUDA backend does (--sample-on device): the server's pipelined path
# through HTTP, streaming, tool calls and disconnects; and a seeded request streamed without
# logprobs must give the text of the same request with logprobs (sampled on the host).
# usage: bash tests/scripts/server_draws.sh PATH/TO/lily   (from the repository root)
set -u
exec bash "$(dirname "$0")/server_conformance.sh" "${1:?usage: server_draws.sh LILY_BIN}" \
    --sample-on device
