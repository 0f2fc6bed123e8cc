-- wrk reporter: one JSON line at the end, so benchmarks read numbers, not text.
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"bytes":%d,"errors":%d,"status_errors":%d,"lat_p50_us":%d,"lat_p99_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
