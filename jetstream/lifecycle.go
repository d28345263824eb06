package jetstream

// The lifecycle: deleting groups and topics ([engine.Deleter]) and the
// health check ([engine.Pinger]).
//
// A group is deleted on the server: its consumers first (from then on the
// group does not exist for any broker), then its dead-letter and redrive
// streams, its members' keys and its deal. A topic is deleted the same
// way: its partition streams (their consumers go with them), then every
// group's streams and keys. Each step forgets what is already gone, so a
// deletion cut short by ctx is finished by calling it again.
//
// Other brokers learn of it from the server, and stop rather than make
// the group again: a group's loop watches its deal key, and a delete of
// it, or a pull that finds the consumer gone, makes it ask whether the
// group's consumer still exists; when it does not, the group is gone in
// that broker too (its fate), as it is in the one that deleted it. A publish
// that finds nobody to answer asks whether the partition's stream exists;
// when it does not, the topic is gone.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/logbus/logbus/engine"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

var (
	_ engine.Deleter = (*eng)(nil)
	_ engine.Pinger  = (*eng)(nil)
)

// Ping asks the server for the account's JetStream information, bounded
// by ctx (and by the request timeout when ctx has no deadline): nil when
// it answered, an error wrapping ErrUnavailable when the connection is
// down (at once, without a request) or the server did not answer. After
// Close began it returns ErrClosed.
func (e *eng) Ping(ctx context.Context) error {
	if err := e.refuse("ping"); err != nil {
		return err
	}
	if st := e.js.Conn().Status(); st != nats.CONNECTED {
		return fmt.Errorf("%w: the connection is %s", engine.ErrUnavailable, strings.ToLower(st.String()))
	}
	actx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok {
		actx, cancel = context.WithTimeout(ctx, e.cfg.requestTimeout)
	}
	defer cancel()
	if _, err := e.js.AccountInfo(actx); err != nil {
		if !errors.Is(err, engine.ErrUnavailable) {
			err = fmt.Errorf("%w (%w)", err, engine.ErrUnavailable)
		}
		return err
	}
	return nil
}

// DeleteGroup deletes the group on the server: its consumers (and so its
// offsets), its dead letters and redriven letters, and its membership.
// This broker's members stop at once (their deliveries in flight finish,
// and commit nothing; their onLeave runs once they did), and so do other
// brokers' members, once their broker learns of it (see the top of this
// file): within MemberTTL/3 of the delete, or one poll wait of a worker's
// pull. Publishers waiting for room the group held in a full Block
// partition get it at their next poll. Every later call on the group's
// handles that can fail fails with ErrSubscription, in every broker, and
// its reads show an empty group (Lag 0, Committed -1, no assignment, no
// dead letters); the name may be used again, as a new group. A group that
// does not exist is ErrSubscription, a topic this broker does not know
// ErrTopicNotFound.
// The requests to the server are bounded by the request timeout, not by
// ctx: the deletion takes place whatever ctx does, and when the server
// does not carry it out the error wraps ErrUnavailable (what was deleted
// stays deleted, and calling it again finishes the work). ctx bounds the
// wait for this broker's deliveries in flight, and an error wrapping only
// ctx's says that wait was cut short ([engine.Deleter]).
func (e *eng) DeleteGroup(ctx context.Context, topic, group string) error {
	if err := e.refuse(fmt.Sprintf("delete group %q", group)); err != nil {
		return err
	}
	if group == "" {
		return fmt.Errorf("empty group name: %w", engine.ErrSubscription)
	}
	e.mu.Lock()
	t := e.topics[topic]
	g := e.groups[groupKey{topic, group}]
	e.mu.Unlock()
	if t == nil || t.isDeleted() {
		return engine.ErrTopicNotFound
	}
	sctx, cancel := e.deleting(ctx)
	defer cancel()
	var stopped <-chan struct{}
	if g != nil {
		// Stop here first: this broker's loop must not heartbeat or deal
		// the group again while the server forgets it.
		stopped = g.fate.vanish(errGroupDeleted)
	}
	found, err := e.deleteGroup(sctx, topic, t.parts, group)
	if err != nil {
		return notDeleted(err)
	}
	if !found && g == nil {
		return fmt.Errorf("%w: no such group", engine.ErrSubscription)
	}
	if stopped != nil {
		select {
		case <-stopped:
		case <-ctx.Done():
			return fmt.Errorf("deleted; deliveries still in flight: %w", ctx.Err())
		}
	}
	return nil
}

// deleteGroup deletes what the server holds of a group of topic (with
// parts partitions), each thing whether or not the rest exists, and
// reports whether any of its consumers or streams existed.
func (e *eng) deleteGroup(ctx context.Context, topic string, parts int, group string) (bool, error) {
	found := false
	for p := range parts {
		err := e.js.DeleteConsumer(ctx, e.names.stream(topic, p), e.names.consumer(group, p))
		switch {
		case err == nil:
			found = true
		case errors.Is(err, natsjs.ErrConsumerNotFound), errors.Is(err, natsjs.ErrStreamNotFound):
		default:
			return found, fmt.Errorf("partition %d: %w", p, err)
		}
	}
	for _, name := range []string{e.names.dlqStream(topic, group), e.names.redriveStream(topic, group)} {
		ok, err := e.deleteStream(ctx, name)
		if err != nil {
			return found, err
		}
		found = found || ok
	}
	return found, e.deleteKeys(ctx, e.names.memberPrefix(topic, group)+"*")
}

// deleteStream deletes a stream, reporting whether it existed.
func (e *eng) deleteStream(ctx context.Context, name string) (bool, error) {
	err := e.js.DeleteStream(ctx, name)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, natsjs.ErrStreamNotFound):
		return false, nil
	}
	return false, fmt.Errorf("stream %s: %w", name, err)
}

// deleteKeys deletes the membership keys and deals that match filter.
func (e *eng) deleteKeys(ctx context.Context, filter string) error {
	for _, kv := range []natsjs.KeyValue{e.kv, e.deals} {
		lister, err := kv.ListKeysFiltered(ctx, filter)
		if err != nil {
			return fmt.Errorf("membership: %w", err)
		}
		var keys []string
		for k := range lister.Keys() {
			keys = append(keys, k)
		}
		_ = lister.Stop()
		for _, k := range keys {
			if err := kv.Delete(ctx, k); err != nil && !errors.Is(err, natsjs.ErrKeyNotFound) {
				return fmt.Errorf("membership key %s: %w", k, err)
			}
		}
	}
	return nil
}

// DeleteTopic deletes the topic on the server: its partition streams
// (their records, and every group's consumers and offsets with them),
// then every group's dead-letter and redrive streams and membership, as
// DeleteGroup does, whichever broker made them. This broker's groups of
// the topic stop at once; other brokers' stop, and their publishes to it
// fail, once they learn of it (see the top of this file). Every later
// call on the topic's handles and its groups' fails with
// ErrTopicNotFound, in this broker also after the name is created again
// (the handles stay deleted). A topic the server does not have is
// ErrTopicNotFound. Bounded by ctx as DeleteGroup; a deletion cut short
// (ErrUnavailable) is finished by calling it again.
func (e *eng) DeleteTopic(ctx context.Context, topic string) error {
	if err := e.refuse(fmt.Sprintf("delete topic %q", topic)); err != nil {
		return err
	}
	e.mu.Lock()
	t := e.topics[topic]
	var groups []*group
	for k, g := range e.groups {
		if k.topic == topic {
			groups = append(groups, g)
		}
	}
	e.mu.Unlock()
	if t != nil {
		t.markDeleted()
	}
	sctx, cancel := e.deleting(ctx)
	defer cancel()
	var stopped []<-chan struct{}
	for _, g := range groups {
		stopped = append(stopped, g.fate.vanish(errTopicDeleted))
	}
	parts := 0
	if t != nil {
		parts = t.parts
	} else if err := e.names.checkTopic(topic, 1); err != nil {
		return engine.ErrTopicNotFound
	} else {
		// A topic this broker did not open: its first stream tells how
		// many partitions it has.
		info, err := e.js.Stream(sctx, e.names.stream(topic, 0))
		switch {
		case err == nil:
			parts = max(1, atoiOr(info.CachedInfo().Config.Metadata["logbus_partitions"], 1))
		case !errors.Is(err, natsjs.ErrStreamNotFound):
			return notDeleted(err)
		}
	}
	found, err := e.deleteTopic(sctx, topic, parts)
	if err != nil {
		return notDeleted(err)
	}
	if !found && t == nil {
		return engine.ErrTopicNotFound
	}
	select {
	case <-waitAll(stopped):
	case <-ctx.Done():
		return fmt.Errorf("deleted; deliveries still in flight: %w", ctx.Err())
	}
	return nil
}

// deleteTopic deletes what the server holds of topic: its partition
// streams, the last first (so that the first, which tells the partition
// count, goes last), then its groups' streams and membership keys. It
// reports whether anything existed.
func (e *eng) deleteTopic(ctx context.Context, topic string, parts int) (bool, error) {
	found := false
	for p := parts - 1; p >= 0; p-- {
		ok, err := e.deleteStream(ctx, e.names.stream(topic, p))
		if err != nil {
			return found, err
		}
		found = found || ok
	}
	enc := encodeName(topic)
	for _, subj := range []string{e.names.prefix + ".dlq." + enc + ".*", e.names.prefix + ".rdr." + enc + ".*.*"} {
		lister := e.js.StreamNames(ctx, natsjs.WithStreamListSubject(subj))
		var streams []string
		for name := range lister.Name() {
			streams = append(streams, name)
		}
		if err := lister.Err(); err != nil {
			return found, fmt.Errorf("list the groups' streams: %w", err)
		}
		for _, name := range streams {
			ok, err := e.deleteStream(ctx, name)
			if err != nil {
				return found, err
			}
			found = found || ok
		}
	}
	return found, e.deleteKeys(ctx, enc+".>")
}

// The errors of calls on a deleted group's or topic's handles (the typed
// layer names the group and topic).
var (
	errGroupDeleted = fmt.Errorf("%w: the group was deleted", engine.ErrSubscription)
	errTopicDeleted = fmt.Errorf("%w: the topic was deleted", engine.ErrTopicNotFound)
)

// notDeleted is the error of a deletion the server did not carry out (or
// only in part): it wraps ErrUnavailable, also when ctx's error was the
// cause, since an error wrapping only ctx's means the deletion took place
// ([engine.Deleter]); calling it again finishes it.
func notDeleted(err error) error {
	if errors.Is(err, engine.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w (%w; not deleted, or in part: call it again)", err, engine.ErrUnavailable)
}

// atoiOr parses a decimal count, or returns def.
func atoiOr(s string, def int) int {
	n := 0
	if s == "" {
		return def
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return def
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// fate is whether a group was deleted (on the server, by this broker or
// another), and why its calls fail from then on. Atomics: no lock.
type fate struct {
	g *group
	// why is set once the group was deleted: why its calls fail.
	why atomic.Pointer[error]
	// suspect is set by a worker whose pull found no consumer: the loop
	// then asks whether the group is gone (onServer).
	suspect atomic.Bool
}

// gone reports whether the group was deleted.
func (f *fate) gone() bool { return f.why.Load() != nil }

// err is why the group's calls fail once it was deleted; nil before.
func (f *fate) err() error {
	if why := f.why.Load(); why != nil {
		return *why
	}
	if f.g.t.isDeleted() {
		return f.g.t.refuseDeleted()
	}
	return nil
}

// vanish stops the group in this broker, once it was deleted on the server
// (by this broker, or found deleted: onServer): every later call fails
// with why; the loop and the workers stop, each after its delivery in
// flight, which commits nothing; the members' keys go (if they still are
// theirs) and their onLeave runs once their workers exited; the group
// leaves the broker's registry, so that its name makes a new group (Close
// still waits for its workers). The channel closes once the workers and
// the loop exited (unless vanish is called from the loop, which exits when
// it returns). Idempotent.
func (f *fate) vanish(why error) <-chan struct{} {
	if !f.why.CompareAndSwap(nil, &why) {
		return closedChan
	}
	g, e := f.g, f.g.e
	e.mu.Lock()
	if e.groups[groupKey{g.t.name, g.name}] == g {
		delete(e.groups, groupKey{g.t.name, g.name})
	}
	e.retired[g] = true
	e.mu.Unlock()
	stopped := g.members.shutdown()
	r, cancel := e.read()
	g.members.leaveAll(r)
	cancel()
	go func() { // exits once the workers and the loop have exited
		<-stopped
		g.closePullers()
		e.mu.Lock()
		delete(e.retired, g)
		e.mu.Unlock()
	}()
	return stopped
}

var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// onServer asks whether the group's consumer still exists, when its loop
// saw its deal deleted or a worker's pull found no consumer: when it does
// not, the group (or its topic) was deleted, by another broker, and the
// group vanishes here too. It reports whether it did.
func (f *fate) onServer() bool {
	g := f.g
	ctx, cancel := g.e.ctx()
	_, err := g.consumers[0].Info(ctx)
	cancel()
	if !f.vanishIfMissing(err) {
		return false
	}
	// The deal this broker may have stored again meanwhile goes too.
	ctx, cancel = g.e.ctx()
	_ = g.e.deals.Delete(ctx, g.e.names.memberPrefix(g.t.name, g.name)+"deal")
	cancel()
	return true
}

// vanishIfMissing makes the group vanish when err, from a request on its
// consumers or its topic's streams, says they do not exist: the group (or
// the topic) was deleted, by another broker. It reports whether it did.
func (f *fate) vanishIfMissing(err error) bool {
	switch {
	case errors.Is(err, natsjs.ErrStreamNotFound):
		f.g.t.markDeleted()
		f.vanish(f.g.t.refuseDeleted())
	case errors.Is(err, natsjs.ErrConsumerNotFound):
		f.vanish(errGroupDeleted)
	default:
		return false
	}
	return true
}

// serverErr is ctxErr for an error of a request on the group's consumers
// or its topic's streams: one saying they do not exist means the group (or
// the topic) was deleted, by another broker, and the group vanishes here
// too: the error is then the deletion's. No lock may be held: vanish runs
// the members' onLeave.
func (f *fate) serverErr(ctx context.Context, err error) error {
	if !f.vanishIfMissing(err) {
		return f.g.e.ctxErr(ctx, err)
	}
	return f.err()
}

// errNoConsumer is a pull answered by the server saying the consumer is
// gone (deleted), or not answered by anyone (no responders).
var errNoConsumer = errors.New("pull: no such consumer")
