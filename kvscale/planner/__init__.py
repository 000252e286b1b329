"""The search and its explanation: every candidate plan (GPU type x tensor parallelism x
precision x batch limit x chunked-prefill budget) sized with kvscale.sizing's model, the
cheapest that meets the SLO chosen, and the reason each other one lost; routing advice; the
one serializer of a plan."""
