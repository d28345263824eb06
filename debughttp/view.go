package debughttp

import (
	"time"
)

// The page's data: one model serves the HTML and the JSON, so the two
// never disagree. Field names follow NATS's monitoring endpoints where
// they mean the same (lag ≈ num_pending), in snake_case.

// overview is the whole broker: the root page.
type overview struct {
	Taken    time.Time   `json:"taken"`
	State    string      `json:"state"`
	Partial  bool        `json:"partial,omitempty"` // the engine cannot describe itself: some fields are zero
	Actions  bool        `json:"actions"`           // whether POST actions are enabled
	Payloads bool        `json:"payloads"`          // whether dead letters' bytes and headers are shown
	Topics   []topicView `json:"topics"`
}

// topicView is one topic, its partitions and its groups.
type topicView struct {
	Name          string          `json:"name"`
	Published     int64           `json:"published"`
	Retained      int             `json:"retained"`
	RetainedBytes int64           `json:"retained_bytes"`
	Reclaimed     int64           `json:"reclaimed"`
	Dropped       int64           `json:"dropped"`
	Expired       int64           `json:"expired"`
	Blocked       int64           `json:"blocked"`
	TimedOut      int64           `json:"timed_out"`
	Partitions    []partitionView `json:"partitions"`
	Groups        []groupView     `json:"groups"`
}

type partitionView struct {
	Partition     int   `json:"partition"`
	Earliest      int64 `json:"earliest"`
	End           int64 `json:"end"`
	Retained      int   `json:"retained"`
	RetainedBytes int64 `json:"retained_bytes"`
}

// groupView is one consumer group of a topic.
type groupView struct {
	Name       string           `json:"name"`
	Topic      string           `json:"topic"`
	Status     string           `json:"status"` // see status
	Paused     bool             `json:"paused"`
	Consumers  []string         `json:"consumers"`
	Assignment map[string][]int `json:"assignment"`
	Lag        int64            `json:"lag"`
	LagSeconds float64          `json:"lag_seconds"` // age of the oldest record not yet committed
	InFlight   int              `json:"in_flight"`   // partitions with a delivery running
	Stuck      int              `json:"stuck"`       // of them, running past the stuck threshold

	Delivered          int64 `json:"delivered"`
	Retried            int64 `json:"retried"`
	DeadLettered       int64 `json:"dead_lettered"`
	Skipped            int64 `json:"skipped"`
	DeadLettersEvicted int64 `json:"dead_letters_evicted"`
	Redriven           int64 `json:"redriven"`         // dead letters sent back to the group
	NumDeadLetters     int   `json:"num_dead_letters"` // held now

	Partitions  []groupPartitionView `json:"partitions"`
	DeadLetters []letterView         `json:"dead_letters"` // the newest first, at most the page's limit
}

// groupPartitionView is a group's state on one partition.
type groupPartitionView struct {
	Partition      int     `json:"partition"`
	Owner          string  `json:"owner"`
	Committed      int64   `json:"committed"`
	End            int64   `json:"end"`
	Lag            int64   `json:"lag"`
	LagSeconds     float64 `json:"lag_seconds"`
	InFlight       bool    `json:"in_flight"`
	Retrying       bool    `json:"retrying"`
	Attempt        int     `json:"attempt"`
	RunningSeconds float64 `json:"running_seconds"`
	Stuck          bool    `json:"stuck"`
	Redriving      int     `json:"redriving"`
}

// letterView is one dead letter: its bytes' sizes, and with WithPayloads
// their previews.
type letterView struct {
	ID          string            `json:"id"`
	Partition   int               `json:"partition"`
	Offset      int64             `json:"offset"`
	Attempts    int               `json:"attempts"`
	Error       string            `json:"error"`
	FailedAt    time.Time         `json:"failed_at"`
	Created     time.Time         `json:"created"`
	Key         preview           `json:"key"`
	Value       preview           `json:"value"`
	NumHeaders  int               `json:"num_headers"`
	HeaderBytes int               `json:"header_bytes"`      // their keys' and values' bytes
	Headers     map[string]string `json:"headers,omitempty"` // with WithPayloads only
}

// stuckView is one delivery running past the stuck threshold, for the
// overview's list.
type stuckView struct {
	Topic, Group string
	groupPartitionView
}

// The statuses of a group, worst first: the one shown is the first that
// holds.
const (
	statusPaused   = "paused"   // paused by an operator
	statusStuck    = "stuck"    // a handler runs past the stuck threshold
	statusUnowned  = "unowned"  // lag on a partition no consumer owns
	statusRetrying = "retrying" // a failed record waits out its backoff
	statusLagging  = "lagging"  // records wait to be committed
	statusOK       = "ok"
)

// status sums up g's partitions.
func status(g *groupView) string {
	var retrying, unowned bool
	for _, p := range g.Partitions {
		retrying = retrying || p.Retrying
		unowned = unowned || p.Lag > 0 && p.Owner == ""
	}
	switch {
	case g.Paused:
		return statusPaused
	case g.Stuck > 0:
		return statusStuck
	case unowned:
		return statusUnowned
	case retrying:
		return statusRetrying
	case g.Lag > 0:
		return statusLagging
	}
	return statusOK
}

// stuck lists the deliveries of o running past the stuck threshold.
func (o *overview) stuck() []stuckView {
	var out []stuckView
	for _, t := range o.Topics {
		for _, g := range t.Groups {
			for _, p := range g.Partitions {
				if p.Stuck {
					out = append(out, stuckView{Topic: t.Name, Group: g.Name, groupPartitionView: p})
				}
			}
		}
	}
	return out
}
