package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// These tests look at the server under the engine's names
// (brokerWithEngine) to see what a deletion left there.

// serverView reads what the server holds under an engine's names.
type serverView struct {
	t  *testing.T
	js natsjs.JetStream
	n  names
}

func newServerView(t *testing.T, e *eng) *serverView {
	t.Helper()
	nc, err := testServer.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &serverView{t: t, js: js, n: e.names}
}

// streams reports which of the named streams exist.
func (v *serverView) streams(names ...string) []string {
	v.t.Helper()
	var out []string
	for _, name := range names {
		_, err := v.js.Stream(v.t.Context(), name)
		switch {
		case err == nil:
			out = append(out, name)
		case !errors.Is(err, natsjs.ErrStreamNotFound):
			v.t.Fatalf("stream %s: %v", name, err)
		}
	}
	return out
}

// consumers reports which of a group's consumers exist on topic.
func (v *serverView) consumers(topic string, parts int, group string) []string {
	v.t.Helper()
	var out []string
	for p := range parts {
		_, err := v.js.Consumer(v.t.Context(), v.n.stream(topic, p), v.n.consumer(group, p))
		switch {
		case err == nil:
			out = append(out, v.n.consumer(group, p))
		case !errors.Is(err, natsjs.ErrConsumerNotFound) && !errors.Is(err, natsjs.ErrStreamNotFound):
			v.t.Fatalf("consumer %s: %v", v.n.consumer(group, p), err)
		}
	}
	return out
}

// keys lists the membership keys and deals under filter.
func (v *serverView) keys(filter string) []string {
	v.t.Helper()
	var out []string
	for _, bucket := range []string{v.n.bucket(), v.n.bucket() + "_deals"} {
		kv, err := v.js.KeyValue(v.t.Context(), bucket)
		if err != nil {
			v.t.Fatal(err)
		}
		l, err := kv.ListKeysFiltered(v.t.Context(), filter)
		if err != nil {
			v.t.Fatal(err)
		}
		for k := range l.Keys() {
			out = append(out, bucket+":"+k)
		}
	}
	return out
}

// TestDeleteGroup deletes a group two brokers share, one dead letter in
// it: its consumers, dead-letter and redrive streams and membership go
// from the server; every broker's handles of it fail with ErrSubscription
// (a broker with members learns of it from its deal's deletion, one
// without from the server's answer to its next request) and none makes it
// again; the name then makes a new group, which reads from the
// start. An unknown group is ErrSubscription, an unknown topic
// ErrTopicNotFound.
func TestDeleteGroup(t *testing.T) {
	opts := testOptions()
	a, ea := brokerWithEngine(t, testServer.Engine(opts...))
	b := brokerOn(t, testServer.Engine(opts...))
	c := brokerOn(t, testServer.Engine(opts...)) // only looks at the group
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ta, err := pubsub.NewTopic(a, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	tb, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pubsub.NewTopic(c, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2)); err != nil {
		t.Fatal(err)
	}
	poison := func(m pubsub.Message[string]) error {
		if m.Value == "poison" {
			return fmt.Errorf("bad: %w", pubsub.ErrPermanent)
		}
		return nil
	}
	ra, rb := pubsubtest.NewRecorder[string](), pubsubtest.NewRecorder[string]()
	ra.FailWith(poison)
	rb.FailWith(poison)
	ga, err := ta.Subscribe("billing", "a", ra)
	if err != nil {
		t.Fatal(err)
	}
	gb, err := tb.Subscribe("billing", "b", rb)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the group dealt between a and b", 10*time.Second, func() bool {
		as := ga.Assignment()
		return len(as["a"]) == 1 && len(as["b"]) == 1
	})
	for i := range 10 {
		v := "v"
		if i == 3 {
			v = "poison"
		}
		if _, err := ta.Publish(ctx, fmt.Sprint("k", i), v); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(ga.DeadLetters()); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
	gc, err := c.Group("billing", "orders")
	if err != nil {
		t.Fatal(err)
	}
	v := newServerView(t, ea)
	streams := []string{v.n.dlqStream("orders", "billing"), v.n.redriveStream("orders", "billing")}
	if got := v.streams(streams...); len(got) != 2 {
		t.Fatalf("before the delete, streams %v, want %v", got, streams)
	}

	if err := a.DeleteGroup(ctx, "billing", "orders"); err != nil {
		t.Fatalf("DeleteGroup: %v", err)
	}
	if got := v.consumers("orders", 2, "billing"); len(got) != 0 {
		t.Errorf("consumers after DeleteGroup: %v, want none", got)
	}
	if got := v.streams(streams...); len(got) != 0 {
		t.Errorf("streams after DeleteGroup: %v, want none", got)
	}
	if got := v.keys(v.n.memberPrefix("orders", "billing") + "*"); len(got) != 0 {
		t.Errorf("membership keys after DeleteGroup: %v, want none", got)
	}
	if err := ga.Seek(ctx, 0, 0); !errors.Is(err, pubsub.ErrSubscription) {
		t.Errorf("Seek on the deleted group's handle: %v, want ErrSubscription", err)
	}
	took := waitFor(t, "the other broker's handle failing with ErrSubscription", 10*time.Second, func() bool {
		return errors.Is(gb.Pause(ctx), pubsub.ErrSubscription)
	})
	t.Logf("the other broker learnt of the delete within %v", took)
	// A broker with no member in the group learns of it from its first
	// request.
	if err := gc.Seek(ctx, 0, 0); !errors.Is(err, pubsub.ErrSubscription) {
		t.Errorf("Seek on a third broker's handle: %v, want ErrSubscription", err)
	}
	if got := gc.Committed(0); got != -1 {
		t.Errorf("Committed on a third broker's handle: %d, want -1 (an empty group)", got)
	}
	handled := len(ra.Messages()) + len(rb.Messages())
	// Neither broker made the group again meanwhile: its loops stopped.
	if got := v.consumers("orders", 2, "billing"); len(got) != 0 {
		t.Errorf("consumers once both brokers knew: %v, want none", got)
	}
	if got := v.keys(v.n.memberPrefix("orders", "billing") + "*"); len(got) != 0 {
		t.Errorf("membership keys once both brokers knew: %v, want none", got)
	}

	again := pubsubtest.NewRecorder[string]()
	if _, err := ta.Subscribe("billing", "a2", again); err != nil {
		t.Fatalf("Subscribe to a deleted group's name: %v", err)
	}
	if _, err := ta.Publish(ctx, "k", "after"); err != nil {
		t.Fatal(err)
	}
	if err := a.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got := len(again.Messages()); got != 11 {
		t.Errorf("the new group under the old name handled %d records, want all 11: the old offsets are forgotten", got)
	}
	if got := len(ra.Messages()) + len(rb.Messages()); got != handled {
		t.Errorf("the deleted group's members handled %d records, then %d: they went on", handled, got)
	}
	if err := a.DeleteGroup(ctx, "nope", "orders"); !errors.Is(err, pubsub.ErrSubscription) {
		t.Errorf("DeleteGroup of an unknown group: %v, want ErrSubscription", err)
	}
	if err := a.DeleteGroup(ctx, "billing", "nope"); !errors.Is(err, pubsub.ErrTopicNotFound) {
		t.Errorf("DeleteGroup on an unknown topic: %v, want ErrTopicNotFound", err)
	}
}

// TestDeleteGroupFreesABlockedPublisher: a publisher waiting for room in
// a Block partition a stuck group holds full gets it once the group is
// deleted.
func TestDeleteGroupFreesABlockedPublisher(t *testing.T) {
	b := newBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, OnFull: pubsub.Block, BlockTimeout: 20 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	if _, err := topic.Subscribe("stuck", "s", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := topic.PublishValue(ctx, "v"); err != nil {
			t.Fatal(err)
		}
	}
	published := make(chan error, 1)
	go func() {
		_, err := topic.PublishValue(ctx, "blocked")
		published <- err
	}()
	waitFor(t, "the publisher waiting for room", 10*time.Second, func() bool { return topic.Stats().Blocked == 1 })
	dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer dcancel()
	// The stuck handler keeps running: DeleteGroup says so when its ctx
	// ends, deleted all the same.
	if err := b.DeleteGroup(dctx, "stuck", "orders"); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DeleteGroup: %v", err)
	}
	select {
	case err := <-published:
		if err != nil {
			t.Errorf("the blocked publish: %v, want it stored once the group was deleted", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the blocked publish still waits 5s after the group that held the partition full was deleted")
	}
}

// TestDeleteTopic deletes a topic two brokers opened, each with a group of
// its own: its partition streams and every group's streams and keys go
// from the server; publishing through either broker's handle fails with
// ErrTopicNotFound, and so do the groups' handles; the name can be created
// again, and the old handle still fails. An unknown topic is
// ErrTopicNotFound.
func TestDeleteTopic(t *testing.T) {
	opts := testOptions()
	a, ea := brokerWithEngine(t, testServer.Engine(opts...))
	b := brokerOn(t, testServer.Engine(opts...))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ta, err := pubsub.NewTopic(a, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	tb, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	ga, err := ta.Subscribe("g1", "a", pubsubtest.NewRecorder[string]())
	if err != nil {
		t.Fatal(err)
	}
	gb, err := tb.Subscribe("g2", "b", pubsubtest.NewRecorder[string]())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if _, err := ta.Publish(ctx, fmt.Sprint("k", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	v := newServerView(t, ea)
	all := []string{v.n.stream("orders", 0), v.n.stream("orders", 1),
		v.n.dlqStream("orders", "g1"), v.n.redriveStream("orders", "g1"),
		v.n.dlqStream("orders", "g2"), v.n.redriveStream("orders", "g2")}
	if got := v.streams(all...); len(got) != len(all) {
		t.Fatalf("before the delete, streams %v, want %v", got, all)
	}

	if err := a.DeleteTopic(ctx, "orders"); err != nil {
		t.Fatalf("DeleteTopic: %v", err)
	}
	if got := v.streams(all...); len(got) != 0 {
		t.Errorf("streams after DeleteTopic: %v, want none", got)
	}
	if got := v.keys(encodeName("orders") + ".>"); len(got) != 0 {
		t.Errorf("membership keys after DeleteTopic: %v, want none", got)
	}
	if _, err := ta.Publish(ctx, "k", "late"); !errors.Is(err, pubsub.ErrTopicNotFound) {
		t.Errorf("Publish on the deleting broker's handle: %v, want ErrTopicNotFound", err)
	}
	if err := ga.Seek(ctx, 0, 0); !errors.Is(err, pubsub.ErrTopicNotFound) {
		t.Errorf("Seek on a group of the deleted topic: %v, want ErrTopicNotFound", err)
	}
	if _, err := tb.Publish(ctx, "k", "late"); !errors.Is(err, pubsub.ErrTopicNotFound) {
		t.Errorf("Publish on the other broker's handle: %v, want ErrTopicNotFound", err)
	}
	waitFor(t, "the other broker's group failing with ErrTopicNotFound", 10*time.Second, func() bool {
		return errors.Is(gb.Pause(ctx), pubsub.ErrTopicNotFound)
	})
	if got := v.streams(all...); len(got) != 0 {
		t.Errorf("streams once both brokers knew: %v, want none", got)
	}

	fresh, err := pubsub.NewTopic(a, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		t.Fatalf("NewTopic with a deleted topic's name: %v", err)
	}
	if pos, err := fresh.Publish(ctx, "k", "new"); err != nil || pos.Offset != 0 {
		t.Errorf("Publish on the new topic: %+v, %v; want offset 0", pos, err)
	}
	if _, err := ta.Publish(ctx, "k", "late"); !errors.Is(err, pubsub.ErrTopicNotFound) {
		t.Errorf("Publish on the deleted topic's handle once the name was created again: %v, want ErrTopicNotFound", err)
	}
	if err := a.DeleteTopic(ctx, "nope"); !errors.Is(err, pubsub.ErrTopicNotFound) {
		t.Errorf("DeleteTopic of an unknown topic: %v, want ErrTopicNotFound", err)
	}
}

// TestPingAfterClose: the engine's Ping is ErrClosed once Close began,
// never ErrUnavailable, even with its connection gone.
func TestPingAfterClose(t *testing.T) {
	b, e := brokerWithEngine(t, testServer.Engine(testOptions()...))
	if err := e.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if err := b.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := e.Ping(t.Context()); !errors.Is(err, pubsub.ErrClosed) || errors.Is(err, pubsub.ErrUnavailable) {
		t.Errorf("Ping after Close: %v, want ErrClosed", err)
	}
}

// TestLifecycleErrorsSayEachNameOnce: the engine's errors add only what
// the typed layer does not say (which names the topic and group), as
// pubsub's TestErrorTextsSayEachNameOnce asks of every engine.
func TestLifecycleErrorsSayEachNameOnce(t *testing.T) {
	b := newBroker(t)
	ctx := t.Context()
	tp, err := pubsub.NewTopic(b, "tq", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	g, err := tp.Subscribe("gq", "cq", pubsubtest.NewRecorder[string]())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteGroup(ctx, "gq", "tq"); err != nil {
		t.Fatal(err)
	}
	seekDeleted := g.Seek(ctx, 0, 0)
	deleteUnknown := b.DeleteGroup(ctx, "nq", "tq")
	if err := b.DeleteTopic(ctx, "tq"); err != nil {
		t.Fatal(err)
	}
	_, publishDeleted := tp.Publish(ctx, "k", "v")
	for _, c := range []struct {
		name  string
		err   error
		names []string
		want  error
	}{
		{"Seek on a deleted group", seekDeleted, []string{"tq", "gq"}, pubsub.ErrSubscription},
		{"DeleteGroup unknown", deleteUnknown, []string{"tq", "nq"}, pubsub.ErrSubscription},
		{"DeleteTopic unknown", b.DeleteTopic(ctx, "nq"), []string{"nq"}, pubsub.ErrTopicNotFound},
		{"Publish to a deleted topic", publishDeleted, []string{"tq"}, pubsub.ErrTopicNotFound},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, c.err, c.want)
			continue
		}
		for _, n := range c.names {
			if got := strings.Count(c.err.Error(), `"`+n+`"`); got != 1 {
				t.Errorf("%s: %q names %q %d times, want once", c.name, c.err, n, got)
			}
		}
	}
}

// TestCloseWaitsForADeletedGroupsHandler: a handler of a deleted group
// still running is waited for by Close, as any delivery in flight, until
// Close's ctx ends and cancels it.
func TestCloseWaitsForADeletedGroupsHandler(t *testing.T) {
	b := pubsub.NewBroker(pubsub.WithEngine(testServer.Engine(testOptions()...)))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	entered, cancelled := make(chan struct{}), make(chan struct{})
	if _, err := topic.Subscribe("g", "c", pubsub.HandlerFunc[string](func(hctx context.Context, _ pubsub.Message[string]) error {
		close(entered)
		<-hctx.Done() // returns only when Close gives up on it
		close(cancelled)
		return hctx.Err()
	})); err != nil {
		t.Fatal(err)
	}
	if _, err := topic.PublishValue(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	<-entered
	dctx, dcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer dcancel()
	if err := b.DeleteGroup(dctx, "g", "orders"); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, pubsub.ErrUnavailable) {
		t.Fatalf("DeleteGroup with its handler running: %v, want only the context's error (deleted all the same)", err)
	}
	const bound = 300 * time.Millisecond
	cctx, ccancel := context.WithTimeout(ctx, bound)
	defer ccancel()
	start := time.Now()
	_ = b.Close(cctx)
	if took := time.Since(start); took < bound-10*time.Millisecond {
		t.Errorf("Close returned after %v with a deleted group's handler running, want it to wait until its ctx ended (%v)", took, bound)
	}
	<-cancelled
}
