package debughttp

import (
	"context"
	"fmt"
	"slices"

	"github.com/logbus/logbus/pubsub"
)

// Building the views from a snapshot: each request builds only the view
// it asked for, and reads dead letters only for the groups it shows.

// overviewOf is the root page: every topic and group summarised, the
// stuck deliveries, and each group's newest dead letters.
func (h *handler) overviewOf(ctx context.Context, snap pubsub.Snapshot) (overview, []stuckView, int) {
	o := h.head(snap)
	o.Topics = make([]topicView, len(snap.Topics))
	var stuck []stuckView
	numStuck := 0
	for i, t := range snap.Topics {
		o.Topics[i] = topicOf(t)
		for j, g := range t.Groups {
			gv := &o.Topics[i].Groups[j]
			gv.DeadLetters, gv.DeadLettersError = h.letters(ctx, t.Name, g)
			for _, p := range g.Partitions {
				if !p.Stuck {
					continue
				}
				if numStuck++; len(stuck) < stuckLimit {
					stuck = append(stuck, stuckView{Topic: t.Name, Group: g.Name, groupPartitionView: groupPartitionOf(t, p)})
				}
			}
		}
	}
	return o, stuck, numStuck
}

// head is the overview without its topics: what every page's header shows.
func (h *handler) head(snap pubsub.Snapshot) overview {
	return overview{Taken: snap.Taken, State: snap.State.String(), Partial: snap.Partial, Actions: h.cfg.actions, Payloads: h.cfg.payloads}
}

// topicOf summarises t: its counters and its groups, not its partitions.
func topicOf(t pubsub.TopicSnapshot) topicView {
	tv := topicView{Name: t.Name, NameEscaped: escaped(t.Name), topicCounters: topicCounters(t.Stats),
		NumPartitions: len(t.Partitions), Groups: make([]groupView, len(t.Groups))}
	for j, g := range t.Groups {
		tv.Groups[j] = groupOf(t, g)
	}
	return tv
}

// topicPage is t's own view: its summary with the page of partitions
// from first.
func topicPage(t pubsub.TopicSnapshot, first int) (topicView, error) {
	tv := topicOf(t)
	pg, err := pageOf(first, len(t.Partitions))
	if err != nil {
		return tv, err
	}
	tv.Page = &pg
	tv.Partitions = make([]partitionView, 0, pg.Shown)
	for _, p := range t.Partitions[pg.First : pg.First+pg.Shown] {
		tv.Partitions = append(tv.Partitions, partitionView{Partition: p.Partition, Earliest: p.Earliest, End: p.End,
			Retained: p.Retained, RetainedBytes: p.RetainedBytes})
	}
	return tv, nil
}

// pageOf is the page of partitionPage partitions from first, of n.
func pageOf(first, n int) (pageView, error) {
	if first < 0 || first > 0 && first >= n {
		return pageView{}, fmt.Errorf("first=%d: there are %d partitions", first, n)
	}
	pg := pageView{First: first, Shown: min(partitionPage, n-first), Prev: -1, Of: n}
	if pg.First+pg.Shown < n {
		pg.Next = pg.First + pg.Shown
	}
	if first > 0 {
		pg.Prev = max(0, first-partitionPage)
	}
	return pg, nil
}

// groupOf summarises g of topic t: its state and counters, summed over its
// partitions, and its consumers; not the partitions themselves.
func groupOf(t pubsub.TopicSnapshot, g pubsub.GroupSnapshot) groupView {
	gv := groupView{Name: g.Name, NameEscaped: escaped(g.Name), Topic: t.Name, TopicEscaped: escaped(t.Name), Paused: g.Paused, NumConsumers: len(g.Consumers),
		Consumers: make([]consumerView, 0, min(len(g.Consumers), consumerLimit)),
		Lag:       g.Lag, LagSeconds: g.LagAge.Seconds(), groupCounters: groupCounters(g.Stats),
		NumDeadLetters: g.DeadLetters, NumPartitions: len(g.Partitions)}
	for _, c := range g.Consumers[:min(len(g.Consumers), consumerLimit)] {
		owned := g.Assignment[c]
		cv := consumerView{Name: c, NameEscaped: escaped(c), NumPartitions: len(owned), Partitions: slices.Sorted(slices.Values(owned))}
		cv.Partitions = slices.Clip(cv.Partitions[:min(len(cv.Partitions), assignmentLimit)])
		gv.Consumers = append(gv.Consumers, cv)
	}
	var retrying, unowned bool
	for _, p := range g.Partitions {
		if p.InFlight {
			gv.InFlight++
		}
		if p.Stuck {
			gv.Stuck++
		}
		retrying = retrying || p.Retrying
		unowned = unowned || p.Lag > 0 && p.Owner == ""
	}
	gv.Status = status(&gv, retrying, unowned)
	return gv
}

// groupPage is g's own view: its summary with the page of its partitions
// from first, and its newest dead letters.
func (h *handler) groupPage(ctx context.Context, t pubsub.TopicSnapshot, g pubsub.GroupSnapshot, first int) (groupView, error) {
	gv := groupOf(t, g)
	pg, err := pageOf(first, len(g.Partitions))
	if err != nil {
		return gv, err
	}
	gv.Page = &pg
	gv.Partitions = make([]groupPartitionView, 0, pg.Shown)
	for _, p := range g.Partitions[pg.First : pg.First+pg.Shown] {
		gv.Partitions = append(gv.Partitions, groupPartitionOf(t, p))
	}
	gv.DeadLetters, gv.DeadLettersError = h.letters(ctx, t.Name, g)
	return gv, nil
}

func groupPartitionOf(t pubsub.TopicSnapshot, p pubsub.GroupPartitionSnapshot) groupPartitionView {
	pv := groupPartitionView{Partition: p.Partition, Owner: p.Owner, OwnerEscaped: escaped(p.Owner), Committed: p.Committed, Lag: p.Lag,
		LagSeconds: p.LagAge.Seconds(), InFlight: p.InFlight, Retrying: p.Retrying, Attempt: p.Attempt,
		RunningSeconds: p.RunningFor.Seconds(), Stuck: p.Stuck, Redriving: p.Redriving}
	if p.Partition >= 0 && p.Partition < len(t.Partitions) {
		pv.End = t.Partitions[p.Partition].End
	}
	return pv
}

// letters shows g's newest dead letters, at most the configured number,
// and says why when it could not read them all (the group went away since
// the snapshot, a remote engine did not answer).
func (h *handler) letters(ctx context.Context, topic string, g pubsub.GroupSnapshot) ([]letterView, string) {
	out := []letterView{}
	if h.cfg.letters == 0 || g.DeadLetters == 0 {
		return out, ""
	}
	letters, err := h.src.letters(ctx, topic, g.Name, h.cfg.letters)
	for _, l := range letters {
		out = append(out, h.cfg.letter(l))
	}
	if err != nil {
		return out, visible(err.Error())
	}
	return out, ""
}

// status sums up g's partitions.
func status(g *groupView, retrying, unowned bool) string {
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

// findTopic finds a topic of snap by name.
func findTopic(snap pubsub.Snapshot, name string) (pubsub.TopicSnapshot, bool) {
	i := slices.IndexFunc(snap.Topics, func(t pubsub.TopicSnapshot) bool { return t.Name == name })
	if i < 0 {
		return pubsub.TopicSnapshot{}, false
	}
	return snap.Topics[i], true
}

// findGroup finds a group of a topic of snap by their names.
func findGroup(snap pubsub.Snapshot, topic, group string) (pubsub.TopicSnapshot, pubsub.GroupSnapshot, bool) {
	t, ok := findTopic(snap, topic)
	if !ok {
		return t, pubsub.GroupSnapshot{}, false
	}
	i := slices.IndexFunc(t.Groups, func(g pubsub.GroupSnapshot) bool { return g.Name == group })
	if i < 0 {
		return t, pubsub.GroupSnapshot{}, false
	}
	return t, t.Groups[i], true
}
