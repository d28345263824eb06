// Command jetstream runs the orders demo across processes' worth of
// brokers, on NATS JetStream:
//
//	go run ./examples/jetstream                                  # an embedded server, file storage in a temp dir
//	go run ./examples/jetstream -server nats://127.0.0.1:4222    # a server of yours
//	go run ./examples/jetstream -cluster                         # three embedded servers forming a cluster
//
// (from the repository's root, whose go.work names this module; or go run .
// from this directory).
//
// Two brokers play two replicas of a billing service: each has its own
// connection to the server, as two processes would, and both subscribe to
// the group "billing" of a topic "orders" with four partitions. The demo
// shows that:
//
//   - the group's partitions are shared between the replicas, each owned by
//     one of them at a time;
//   - when one replica stops mid-way through a batch, the other takes over
//     its partitions, and no order is handled twice;
//   - when everything stops (the embedded server too) and starts again on
//     the same store, the group resumes at its committed offsets: only what
//     was published while it was down is handled.
//
// Records, offsets and the group's position live in the server, on disk,
// not in the brokers. Lines that depend on timing say so; every other line
// is the same on every run with the embedded server.
//
// With -cluster, three NATS servers embedded in the process form a
// JetStream cluster on loopback (random ports, a store each in a temporary
// directory), and every stream, consumer and bucket the engine makes has
// three replicas (jetstream.WithReplicas(3)). The demo shows that when the
// server leading most of the topic's partitions stops mid-run, publishing
// and consuming go on with nothing lost (an order whose ack was lost with
// the connection to that server comes again after AckWait, with a higher
// Attempt), that a broker opened while it is down joins the group, and
// that the server catches up when it starts again. A server that shuts down hands its leaderships
// over first; one that crashes leaves the others to elect new leaders,
// which stalls its partitions for 4-9s (the jetstream package
// documentation says what each replica count survives).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/jetstream"
	"github.com/logbus/logbus/pubsub"
	"github.com/nats-io/nats.go"
)

// Order is the value of every record, stored as JSON.
type Order struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Status   string `json:"status"`
}

func (o Order) String() string { return o.ID + ":" + o.Status }

const (
	topicName  = "orders"
	groupName  = "billing"
	partitions = 4
	// settle bounds waiting for the replicas to share the partitions: the
	// engine's membership notices a join or a leave within a heartbeat.
	settle = 20 * time.Second
)

var customers = []string{"alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"}

// batch returns one order per customer for each status, in that order:
// created, paid, shipped. Order IDs are numbered from first.
func batch(first int) []Order {
	var out []Order
	for _, status := range []string{"created", "paid", "shipped"} {
		for i, c := range customers {
			out = append(out, Order{ID: fmt.Sprintf("%s-%d", strings.ToUpper(c[:1]), first+i), Customer: c, Status: status})
		}
	}
	return out
}

func main() {
	log.SetFlags(0)
	server := flag.String("server", "", "URL of a NATS server with JetStream; empty starts an embedded one with file storage in a temporary directory")
	cluster := flag.Bool("cluster", false, "start three embedded servers forming a cluster, with three replicas of everything, and stop one mid-run")
	flag.Parse()
	var err error
	if *cluster {
		err = runCluster(context.Background(), os.Stdout)
	} else {
		err = run(context.Background(), os.Stdout, *server)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// demo is the state of one run.
type demo struct {
	url    string             // the server's URL
	dir    string             // the embedded server's store; "" with -server
	srv    *jetstream.Server  // the embedded server; nil with -server
	prefix string             // the namespace of every name the demo creates
	log    *handled           // what every replica handled
	nodes  []*node            // every broker started, closed at the end
	opts   []jetstream.Option // the engine's options beyond the demo's timings
}

// run is the demo, writing to out. With url empty it starts (and restarts)
// an embedded server in a temporary directory it removes at the end.
func run(ctx context.Context, out io.Writer, url string) (err error) {
	d := &demo{url: url, prefix: "demo", log: newHandled()}
	defer d.closeAll()
	fmt.Fprintln(out, "logbus on NATS JetStream: two replicas of a billing service share a group")
	if url == "" {
		if d.dir, err = os.MkdirTemp("", "logbus-jetstream-demo-"); err != nil {
			return err
		}
		defer os.RemoveAll(d.dir)
		if err := d.startServer(); err != nil {
			return err
		}
		defer func() { d.srv.Shutdown() }()
		section(out, "an embedded NATS server with JetStream, file storage in a temporary directory")
	} else {
		// A server of the user's: names of their own, so that a second run
		// starts afresh.
		d.prefix = fmt.Sprintf("demo-%d", time.Now().UnixNano())
		section(out, "the NATS server at "+url)
	}

	// Two replicas, and a publisher: three brokers, three connections.
	a, err := d.replica("replica-a")
	if err != nil {
		return err
	}
	b, err := d.replica("replica-b")
	if err != nil {
		return err
	}
	pub, err := d.node("checkout")
	if err != nil {
		return err
	}
	section(out, fmt.Sprintf("two replicas join group %q of topic %q (%d partitions)", groupName, topicName, partitions))
	if err := waitOwners(map[*replica][]int{a: nil, b: nil}); err != nil {
		return err
	}
	fmt.Fprintf(out, "replica-a owns partitions %v\n", a.owned())
	fmt.Fprintf(out, "replica-b owns partitions %v\n", b.owned())
	fmt.Fprintln(out, "  each partition has one owner in the group at a time")

	section(out, "24 orders: created, paid and shipped for 8 customers; the key is the customer")
	first := batch(1)
	if err := publish(ctx, pub.topic, first); err != nil {
		return err
	}
	if err := drain(ctx, a.broker); err != nil {
		return err
	}
	fmt.Fprintf(out, "orders handled: %d, each once: %v\n", d.log.distinct(), d.log.duplicates() == 0)
	fmt.Fprintf(out, "every customer's orders were handled in order: %v\n", d.log.inOrder())
	fmt.Fprintf(out, "  (varies with timing) replica-a handled %d, from partitions %v; replica-b %d, from partitions %v\n",
		d.log.count(a.name), d.log.partitions(a.name), d.log.count(b.name), d.log.partitions(b.name))
	fmt.Fprintln(out, "  a partition moving to replica-b moves at replica-a's next pull, so replica-a may handle its first orders")

	section(out, "replica-b stops mid-way through the next 24 orders")
	second := batch(100)
	b.stopAfter(3)
	if err := publish(ctx, pub.topic, second); err != nil {
		return err
	}
	<-b.stopNow
	lctx, cancel := context.WithTimeout(ctx, settle)
	defer cancel()
	// Leave waits for replica-b's deliveries in flight, then hands its
	// partitions over; nothing it committed is delivered again.
	if err := b.group.Leave(lctx, b.name); err != nil {
		return fmt.Errorf("replica-b leaving: %w", err)
	}
	if err := waitOwners(map[*replica][]int{a: {0, 1, 2, 3}}); err != nil {
		return err
	}
	fmt.Fprintf(out, "replica-b left; replica-a now owns partitions %v\n", a.owned())
	if err := drain(ctx, a.broker); err != nil {
		return err
	}
	fmt.Fprintf(out, "all %d orders of both batches handled: %v\n", len(first)+len(second), d.log.distinct() == len(first)+len(second))
	fmt.Fprintf(out, "orders handled twice: %d\n", d.log.duplicates())
	fmt.Fprintf(out, "every customer's orders were handled in order: %v\n", d.log.inOrder())
	fmt.Fprintf(out, "  (varies with timing) replica-b handled %d of the second batch before it left, replica-a the other %d\n",
		d.log.countFrom(b.name, 100), d.log.countFrom(a.name, 100))
	if err := b.stop(); err != nil {
		return err
	}
	if err := a.stop(); err != nil {
		return err
	}

	section(out, "while no replica runs, checkout publishes 8 more orders")
	third := batch(200)[:8]
	if err := publish(ctx, pub.topic, third); err != nil {
		return err
	}
	if err := pub.stop(); err != nil {
		return err
	}
	if d.srv != nil {
		d.srv.Shutdown()
		if err := d.startServer(); err != nil {
			return err
		}
		fmt.Fprintln(out, "the server restarted on the same store")
	}

	section(out, "replica-a starts again")
	before := d.log.total()
	a, err = d.replica("replica-a")
	if err != nil {
		return err
	}
	if err := waitOwners(map[*replica][]int{a: {0, 1, 2, 3}}); err != nil {
		return err
	}
	if err := drain(ctx, a.broker); err != nil {
		return err
	}
	var committed []string
	for p := range partitions {
		committed = append(committed, fmt.Sprint(a.group.Committed(p)))
	}
	fmt.Fprintf(out, "committed offsets per partition: [%s]\n", strings.Join(committed, " "))
	again := d.log.since(before)
	slices.Sort(again)
	fmt.Fprintf(out, "replica-a handled %d orders: %s\n", len(again), strings.Join(again, " "))
	fmt.Fprintf(out, "  only those published while it was down: it resumed at the group's committed offsets\n")
	fmt.Fprintf(out, "orders handled twice, over the whole demo: %d\n", d.log.duplicates())
	return a.stop()
}

func (d *demo) startServer() (err error) {
	d.srv, err = jetstream.StartServer(d.dir)
	if err == nil {
		d.url = d.srv.URL()
	}
	return err
}

// node is one broker on a connection of its own, with the topic.
type node struct {
	nc     *nats.Conn
	broker *pubsub.Broker
	topic  *pubsub.Topic[string, Order]
}

func (d *demo) node(name string) (*node, error) {
	// A connection that loses its server moves to another of the URL's at
	// once, and never gives up (Close ends it).
	nc, err := nats.Connect(d.url, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("%s: connect: %w", name, err)
	}
	n := &node{nc: nc}
	d.nodes = append(d.nodes, n)
	eng, err := jetstream.Connect(nc, append([]jetstream.Option{jetstream.WithPrefix(d.prefix),
		jetstream.WithMemberTTL(time.Second), jetstream.WithAckWait(2 * time.Second)}, d.opts...)...)
	if err != nil {
		return nil, err
	}
	n.broker = pubsub.NewBroker(pubsub.WithEngine(eng))
	if err := n.broker.Err(); err != nil {
		return nil, err
	}
	n.topic, err = pubsub.NewTopic(n.broker, topicName, codec.String(), codec.JSON[Order](), pubsub.WithPartitions(partitions))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return n, nil
}

// stop closes n's broker, allowing it 10s to drain, then its connection
// (the engine never closes a connection it was given).
func (n *node) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := n.broker.Close(ctx)
	n.nc.Close()
	return err
}

// closeAll stops whatever an early return left running.
func (d *demo) closeAll() {
	for _, n := range d.nodes {
		if n.broker != nil {
			_ = n.stop() // Close is idempotent
		} else {
			n.nc.Close()
		}
	}
}

// replica is a broker subscribed to the group.
type replica struct {
	*node
	name  string
	group *pubsub.Group[Order]

	mu        sync.Mutex
	stopIn    int           // stop after this many more orders; 0: never
	stopNow   chan struct{} // closed when stopIn reached 0
	stopClose sync.Once
}

func (d *demo) replica(name string) (*replica, error) {
	n, err := d.node(name)
	if err != nil {
		return nil, err
	}
	r := &replica{node: n, name: name, stopNow: make(chan struct{})}
	r.group, err = n.topic.Subscribe(groupName, name, pubsub.HandlerFunc[Order](
		func(ctx context.Context, msg pubsub.Message[Order]) error {
			// Billing takes a moment, so that a replica stopping finds
			// work left to hand over.
			t := time.NewTimer(10 * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return ctx.Err()
			}
			d.log.add(name, msg)
			r.handled()
			return nil
		}))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return r, nil
}

// stopAfter makes stopNow close once r has handled n more orders.
func (r *replica) stopAfter(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopIn = n
}

func (r *replica) handled() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopIn == 0 {
		return
	}
	if r.stopIn--; r.stopIn == 0 {
		r.stopClose.Do(func() { close(r.stopNow) })
	}
}

func (r *replica) owned() []int {
	ps := slices.Clone(r.group.Assignment()[r.name])
	slices.Sort(ps)
	return ps
}

// waitOwners waits until every replica owns what want says (nil: its
// share of the partitions, as even as they divide, disjoint from the
// others'), at most settle. The engine's membership decides when; there
// is nothing to wait on but the assignment itself.
func waitOwners(want map[*replica][]int) error {
	deadline := time.Now().Add(settle)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	least, most := partitions/len(want), (partitions+len(want)-1)/len(want)
	for {
		seen, ok := map[int]bool{}, true
		for r, ps := range want {
			got := r.owned()
			if ps != nil && !slices.Equal(got, ps) || ps == nil && (len(got) < least || len(got) > most) {
				ok = false
			}
			for _, p := range got {
				ok = ok && !seen[p]
				seen[p] = true
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			var got []string
			for r := range want {
				got = append(got, fmt.Sprintf("%s=%v", r.name, r.owned()))
			}
			slices.Sort(got)
			return fmt.Errorf("the replicas did not settle in %v: %v", settle, got)
		}
		<-tick.C
	}
}

func publish(ctx context.Context, t *pubsub.Topic[string, Order], orders []Order) error {
	for _, o := range orders {
		if _, err := t.Publish(ctx, o.Customer, o); err != nil {
			return fmt.Errorf("publish %s: %w", o, err)
		}
	}
	return nil
}

// drain waits until the group committed everything published, at most
// settle.
func drain(ctx context.Context, b *pubsub.Broker) error {
	ctx, cancel := context.WithTimeout(ctx, settle)
	defer cancel()
	return b.Drain(ctx)
}

func section(out io.Writer, title string) { fmt.Fprintf(out, "\n== %s ==\n", title) }

// handled is what every replica handled, in order. Handlers of different
// partitions run at once: it locks.
type handled struct {
	mu     sync.Mutex
	orders []handledOrder
}

type handledOrder struct {
	replica string
	order   Order
	msg     string // topic/partition@offset
	part    int
	attempt int
}

func newHandled() *handled { return &handled{} }

func (h *handled) add(replica string, msg pubsub.Message[Order]) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.orders = append(h.orders, handledOrder{replica: replica, order: msg.Value,
		msg: fmt.Sprintf("%d@%d", msg.Partition, msg.Offset), part: msg.Partition, attempt: msg.Attempt})
}

func (h *handled) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.orders)
}

func (h *handled) count(replica string) int { return h.countFrom(replica, 0) }

// countFrom counts replica's orders whose number is at least from.
func (h *handled) countFrom(replica string, from int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, o := range h.orders {
		var num int
		fmt.Sscanf(o.order.ID[2:], "%d", &num)
		if o.replica == replica && num >= from {
			n++
		}
	}
	return n
}

func (h *handled) partitions(replica string) []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ps []int
	for _, o := range h.orders {
		if o.replica == replica && !slices.Contains(ps, o.part) {
			ps = append(ps, o.part)
		}
	}
	slices.Sort(ps)
	return ps
}

// distinct counts the different records handled.
func (h *handled) distinct() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]bool{}
	for _, o := range h.orders {
		seen[o.msg] = true
	}
	return len(seen)
}

func (h *handled) duplicates() int {
	return h.total() - h.distinct()
}

// distinctOrders counts the different orders handled (an order stored
// twice, at two offsets, counts once).
func (h *handled) distinctOrders() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]bool{}
	for _, o := range h.orders {
		seen[o.order.String()] = true
	}
	return len(seen)
}

// storedTwice counts the orders handled at more than one offset: stored
// more than once, by a publish retried after an error whose outcome was
// unknown.
func (h *handled) storedTwice() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	at := map[string]map[string]bool{}
	for _, o := range h.orders {
		if at[o.order.String()] == nil {
			at[o.order.String()] = map[string]bool{}
		}
		at[o.order.String()][o.msg] = true
	}
	n := 0
	for _, offsets := range at {
		n += len(offsets) - 1
	}
	return n
}

// unexplained counts the records handled again without a higher Attempt:
// a redelivery the engine does not account for. (One with a higher
// Attempt is a retry, or a record whose ack was lost, with its
// connection for instance.)
func (h *handled) unexplained() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	last := map[string]int{}
	n := 0
	for _, o := range h.orders {
		if a, ok := last[o.msg]; ok && o.attempt <= a {
			n++
		}
		last[o.msg] = o.attempt
	}
	return n
}

// inOrder reports whether each customer's orders were handled in the order
// they were published: created, paid, shipped, batch after batch.
func (h *handled) inOrder() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	rank := map[string]int{"created": 0, "paid": 1, "shipped": 2}
	last := map[string]int{}
	for _, o := range h.orders {
		var num int
		fmt.Sscanf(o.order.ID[2:], "%d", &num)
		key := num/100*3 + rank[o.order.Status] + 1
		if key < last[o.order.Customer] {
			return false
		}
		last[o.order.Customer] = key
	}
	return true
}

// since returns the orders handled after the first n, as "ID:status".
func (h *handled) since(n int) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, o := range h.orders[n:] {
		out = append(out, o.order.String())
	}
	return out
}
