"""Every component id of the dashboard, in one place (pages and callbacks import these).

Ids are prefixed by page so two pages can never collide in Dash's single callback graph.
"""

# Shell (every page)
NAV = "nav"
SOURCE_LINE = "source-line"
SOURCE_PROBLEMS = "source-problems"  # the banner naming a source that cannot be read, on every page
SOURCE_CHECK = "source-check"  # the interval that checks the sources again

# Live page
LIVE_INTERVAL = "live-interval"
LIVE_TICK = "live-tick"  # the interval, gated: one fetch in flight at a time
LIVE_GATE = "live-gate"
LIVE_DATA = "live-data"  # points for the charts: a full frame, only the new points, or none; and its tick
LIVE_ROUTED = "live-routed"  # the tick whose points the charts have taken (written in the browser)
LIVE_CURSOR = "live-cursor"  # what the browser already has: last timestamp, chart signatures
LIVE_DIAGNOSIS = "live-diagnosis"  # the diagnosis JSON, rewritten only when it changes
LIVE_HEALTH = "live-health"  # stale / source-down state for the badge
LIVE_TARGET = "live-target"
LIVE_INSTANCE = "live-instance"  # Prometheus-backed: which scrape target
LIVE_RANGE = "live-range"
LIVE_HISTORY = "live-history"  # fixed [from, to] from a Fleet link; empty when live
LIVE_BADGE = "live-badge"
LIVE_BANNER = "live-banner"
LIVE_DOWNLOAD = "live-download"  # "download this window": the window on show as a trace file
LIVE_GRAPH_KV_LATENCY = "live-graph-kv-latency"
LIVE_GRAPH_BANDWIDTH = "live-graph-bandwidth"
LIVE_GRAPH_TRANSFERS = "live-graph-transfers"
LIVE_GRAPH_ITL_KV = "live-graph-itl-kv"

# Ledger page
LEDGER_UPLOAD = "ledger-upload"
LEDGER_UPLOAD_STATUS = "ledger-upload-status"
LEDGER_MODEL = "ledger-model"
LEDGER_UPLOADED_SHAPE = "ledger-uploaded-shape"
LEDGER_GPU = "ledger-gpu"
LEDGER_CONTEXT = "ledger-context"
LEDGER_BATCH = "ledger-batch"
LEDGER_KV_DTYPE = "ledger-kv-dtype"
LEDGER_HOST_BANDWIDTH = "ledger-host-bandwidth"
LEDGER_GPU_MEMORY_UTILIZATION = "ledger-gpu-memory-utilization"
LEDGER_TP = "ledger-tp"
LEDGER_RESULT = "ledger-result"
LEDGER_WHAT_IF = "ledger-what-if"
LEDGER_OFFLOAD = "ledger-offload"
LEDGER_ERROR = "ledger-error"

# Fleet page
FLEET_RANGE = "fleet-range"
FLEET_END = "fleet-end"
FLEET_REFRESH = "fleet-refresh"
FLEET_STATE = "fleet-state"  # the summary's token on the server, the page shown, what the browser has
FLEET_STATUS = "fleet-status"
FLEET_NAMESPACE = "fleet-namespace"
FLEET_VERDICT = "fleet-verdict"  # the counts by verdict, which are the verdict filter
FLEET_SEARCH = "fleet-search"
FLEET_NOTES = "fleet-notes"
FLEET_TABLE = "fleet-table"
FLEET_PAGER = "fleet-pager"
FLEET_PREV = "fleet-prev"
FLEET_NEXT = "fleet-next"
