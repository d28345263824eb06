package debughttp

import (
	"context"
	"fmt"
	"slices"

	"github.com/logbus/logbus/pubsub"
)

// brokerSource reads a broker through its Snapshot and acts on its groups
// by name (Broker.Group).
type brokerSource struct{ b *pubsub.Broker }

func (s brokerSource) overview(c *config) overview {
	snap := s.b.Snapshot()
	o := overview{Taken: snap.Taken, State: snap.State.String(), Partial: snap.Partial, Actions: c.actions, Payloads: c.payloads,
		Topics: make([]topicView, len(snap.Topics))}
	for i, t := range snap.Topics {
		tv := topicView{Name: t.Name, Published: t.Stats.Published, Retained: t.Stats.Retained, RetainedBytes: t.Stats.RetainedBytes,
			Reclaimed: t.Stats.Reclaimed, Dropped: t.Stats.Dropped, Expired: t.Stats.Expired, Blocked: t.Stats.Blocked,
			TimedOut: t.Stats.TimedOut, Partitions: make([]partitionView, len(t.Partitions)), Groups: make([]groupView, len(t.Groups))}
		for j, p := range t.Partitions {
			tv.Partitions[j] = partitionView{Partition: p.Partition, Earliest: p.Earliest, End: p.End, Retained: p.Retained, RetainedBytes: p.RetainedBytes}
		}
		for j, g := range t.Groups {
			tv.Groups[j] = s.group(t, g, c)
		}
		o.Topics[i] = tv
	}
	return o
}

// group describes g of topic t, with its newest dead letters.
func (s brokerSource) group(t pubsub.TopicSnapshot, g pubsub.GroupSnapshot, c *config) groupView {
	gv := groupView{Name: g.Name, Topic: t.Name, Paused: g.Paused, Consumers: g.Consumers, Assignment: g.Assignment,
		Lag: g.Lag, LagSeconds: g.LagAge.Seconds(), Delivered: g.Stats.Delivered, Retried: g.Stats.Retried,
		DeadLettered: g.Stats.DeadLettered, Skipped: g.Stats.Skipped, DeadLettersEvicted: g.Stats.DeadLettersEvicted, Redriven: g.Stats.Redriven,
		NumDeadLetters: g.DeadLetters, Partitions: make([]groupPartitionView, len(g.Partitions)), DeadLetters: []letterView{}}
	if gv.Consumers == nil {
		gv.Consumers = []string{}
	}
	if gv.Assignment == nil {
		gv.Assignment = map[string][]int{}
	}
	for i, p := range g.Partitions {
		pv := groupPartitionView{Partition: p.Partition, Owner: p.Owner, Committed: p.Committed, Lag: p.Lag,
			LagSeconds: p.LagAge.Seconds(), InFlight: p.InFlight, Retrying: p.Retrying, Attempt: p.Attempt,
			RunningSeconds: p.RunningFor.Seconds(), Stuck: p.Stuck, Redriving: p.Redriving}
		if p.Partition >= 0 && p.Partition < len(t.Partitions) {
			pv.End = t.Partitions[p.Partition].End
		}
		if pv.InFlight {
			gv.InFlight++
		}
		if pv.Stuck {
			gv.Stuck++
		}
		gv.Partitions[i] = pv
	}
	gv.Status = status(&gv)
	if c.letters > 0 && g.DeadLetters > 0 {
		if raw, err := s.b.Group(g.Name, t.Name); err == nil { // err: the group went away since the snapshot
			all := raw.DeadLetters()
			for _, l := range slices.Backward(all[max(0, len(all)-c.letters):]) {
				gv.DeadLetters = append(gv.DeadLetters, c.letter(l))
			}
		}
	}
	return gv
}

func (s brokerSource) act(ctx context.Context, topic, group string, a action) (int, error) {
	g, err := s.b.Group(group, topic)
	if err != nil {
		return 0, err
	}
	switch a.kind {
	case "pause":
		return 0, g.Pause(ctx)
	case "resume":
		return 0, g.Resume(ctx)
	case "replay":
		return 0, g.Replay(ctx, a.from)
	case "redrive":
		return redrive(ctx, g, a.ids)
	}
	return 0, fmt.Errorf("no action %q", a.kind)
}
