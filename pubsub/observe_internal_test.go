package pubsub

import (
	"context"
	"errors"
	"go/ast"
	"go/constant"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/engine"
)

type (
	retryOnly        struct{}
	deadLetterOnly   struct{}
	rebalanceOnly    struct{}
	backpressureOnly struct{}
	dropOnly         struct{}
	expireOnly       struct{}
	skipOnly         struct{}
	stuckOnly        struct{}
	publishOnly      struct{}
)

func (retryOnly) OnRetry(RetryEvent)                                           {}
func (deadLetterOnly) OnDeadLetter(DeadLetterEvent)                            {}
func (rebalanceOnly) OnRebalance(RebalanceEvent)                               {}
func (backpressureOnly) OnBackpressure(BackpressureEvent)                      {}
func (dropOnly) OnDrop(TrimEvent)                                              {}
func (expireOnly) OnExpire(TrimEvent)                                          {}
func (skipOnly) OnSkip(SkipEvent)                                              {}
func (stuckOnly) OnStuck(StuckEvent)                                           {}
func (publishOnly) OnPublished(context.Context, *PublishInfo, Position, error) {}

// The engine gets an observer exactly when something listens to the
// events only an engine sees: a hook for one of them, or a logger.
func TestEngineObserverOnlyWhenSomethingListens(t *testing.T) {
	if o, err := newObserver(nil, nil, 0); o != nil || err != nil {
		t.Fatalf("newObserver with nothing: %v, %v; want nil, nil", o, err)
	}
	engineHooks := []Hook{retryOnly{}, deadLetterOnly{}, rebalanceOnly{}, backpressureOnly{}, dropOnly{}, expireOnly{}, skipOnly{}, stuckOnly{}}
	for i := range engineHooks {
		for _, hooks := range [][]Hook{engineHooks[i : i+1], engineHooks[i:min(i+2, len(engineHooks))]} {
			o, err := newObserver(hooks, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			if o.engineObserver() == nil {
				t.Errorf("hooks %T: the engine gets no observer", hooks)
			}
			if o.publishes || o.delivers || o.timed {
				t.Errorf("hooks %T: publishes %v delivers %v timed %v; want the publish and delivery paths left alone",
					hooks, o.publishes, o.delivers, o.timed)
			}
		}
	}
	o, err := newObserver([]Hook{publishOnly{}}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if o.engineObserver() != nil {
		t.Error("a publish hook alone gives the engine an observer: it would pay for events nobody reads")
	}
	if !o.publishes || o.delivers || o.timed {
		t.Errorf("a published hook alone: publishes %v delivers %v timed %v; want true false false", o.publishes, o.delivers, o.timed)
	}
	if o, _ := newObserver(nil, slog.New(slog.DiscardHandler), 0); o.engineObserver() == nil || !o.delivers {
		t.Error("a logger: the engine gets no observer, or deliveries are not wrapped to log panics")
	}
	if _, err := newObserver([]Hook{struct{}{}}, nil, 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("a value that hooks nothing: %v, want ErrInvalid", err)
	}
}

// A rate-limited warning is let through once per warnEvery per key, and
// then says how many it held back.
func TestLimiterLetsOneThroughPerInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l limiter
		type step struct {
			wait time.Duration
			key  string
			ok   bool
			left int64
		}
		for i, s := range []step{
			{0, "a", true, 0},
			{0, "a", false, 0},
			{0, "b", true, 0}, // another key has its own interval
			{warnEvery / 2, "a", false, 0},
			{warnEvery / 2, "a", true, 2}, // exactly warnEvery after the last let through
			{warnEvery - 1, "a", false, 0},
		} {
			time.Sleep(s.wait)
			if ok, left := l.allow("dead letter", "orders", s.key, 0); ok != s.ok || left != s.left {
				t.Errorf("step %d: allow = %v, %d; want %v, %d", i, ok, left, s.ok, s.left)
			}
		}
	})
}

// The hooks table (observer.slots) has a line for every Hook interface the
// package declares, read from its own source, and for nothing else: a new
// Hook interface fails this until it is in the table, where WithHooks
// registers it and its place on a path is said.
func TestHookTableCoversEveryHookInterface(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				if _, isInterface := ts.Type.(*ast.InterfaceType); isInterface && strings.HasPrefix(ts.Name.Name, "Hook") {
					declared[ts.Name.Name] = true
				}
			}
		}
	}
	if len(declared) == 0 {
		t.Fatal("found no Hook interface in the package's source")
	}
	inTable := map[string]bool{}
	for _, s := range (&observer{}).slots() {
		if s.iface.Kind() != reflect.Interface || s.iface.PkgPath() != reflect.TypeFor[Broker]().PkgPath() {
			t.Errorf("table line %v: not an interface of package pubsub", s.iface)
		}
		if inTable[s.iface.Name()] {
			t.Errorf("table line %v: twice in the table", s.iface)
		}
		inTable[s.iface.Name()] = true
		if s.iface.NumMethod() != 1 {
			t.Errorf("%v has %d methods; a Hook interface has one, so a hook implements only the events it wants", s.iface, s.iface.NumMethod())
		}
	}
	for name := range declared {
		if !inTable[name] {
			t.Errorf("%s is declared but not in the hooks table (observer.slots): WithHooks would refuse a hook of it, and nothing would raise it", name)
		}
	}
	for name := range inTable {
		if !declared[name] {
			t.Errorf("%s is in the hooks table but declared nowhere in the package", name)
		}
	}
	calls := reflect.TypeFor[*HookCalls]()
	for _, s := range (&observer{}).slots() {
		if !calls.Implements(s.iface) {
			t.Errorf("HookCalls does not implement %v: give it the method, so the tests can see the hook raised", s.iface)
		}
	}
}

// Each line of the hooks table says where its events are raised (the
// typed layer's publish or delivery path, the engine, NewBroker and
// Close), and the broker derives from it what to wrap and whether the
// engine gets an observer. So each place must raise exactly the hooks its
// lines name: a hook marked for the wrong place would never be called
// when it is the only one.
func TestHookTableSaysWhereEachHookIsRaised(t *testing.T) {
	ctx := context.Background()
	raisers := map[raisedBy]func(t *testing.T, h *HookCalls){
		byPublish: func(t *testing.T, h *HookCalls) {
			o := mustObserver(t, h)
			p := &PublishInfo{Topic: "orders"}
			o.onPublished(o.onPublish(ctx, p), p, Position{}, nil)
		},
		byDelivery: func(t *testing.T, h *HookCalls) {
			o := mustObserver(t, h)
			ok := func(context.Context, *engine.Delivery) error { return nil }
			if err := o.wrapDelivery("billing", "b1", ok)(ctx, &engine.Delivery{Topic: "orders", Record: &engine.Record{}}); err != nil {
				t.Fatal(err)
			}
			okBatch := func(context.Context, *engine.Batch) error { return nil }
			b := &engine.Batch{Topic: "orders", Records: []*engine.Record{{}}, IDs: []string{"1"}}
			if err := o.wrapBatch("billing", "b1", okBatch)(ctx, b); err != nil {
				t.Fatal(err)
			}
		},
		byEngine: func(t *testing.T, h *HookCalls) {
			o := mustObserver(t, h)
			for k := range 256 { // every EventKind, known or not
				o.Observe(&engine.Event{Kind: engine.EventKind(k), Topic: "orders", Err: errors.New("test")})
			}
		},
		byBroker: func(t *testing.T, h *HookCalls) {
			b := NewBroker(WithHooks(h))
			if err := b.Close(ctx); err != nil {
				t.Fatal(err)
			}
		},
	}
	byName := map[raisedBy]string{byBroker: "by the broker", byPublish: "on publish", byDelivery: "on delivery", byEngine: "by the engine"}
	slots := (&observer{}).slots()
	for by, raise := range raisers {
		want := map[string]bool{}
		for _, s := range slots {
			if s.by == by {
				want[s.iface.Method(0).Name] = true
			}
		}
		h := &HookCalls{}
		raise(t, h)
		for _, s := range slots {
			name := s.iface.Method(0).Name
			if got := h.Count(name) > 0; got != want[name] {
				t.Errorf("raised %s: %s called %v; the table says %v", byName[by], name, got, want[name])
			}
		}
	}
	if len(raisers) != int(byEngine)+1 {
		t.Errorf("%d places checked; the table has %d", len(raisers), byEngine+1)
	}
}

func mustObserver(t *testing.T, hooks ...Hook) *observer {
	t.Helper()
	o, err := newObserver(hooks, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// Every EventKind the engine package declares (read from its source) is
// handed to a hook and logged by Observe: a new kind fails this until
// pubsub maps it, rather than being dropped in silence.
func TestEveryEngineEventIsRaisedAndLogged(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join("..", "engine", "observe.go"), nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	// The file alone: the names it takes from the package's other files
	// are errors to ignore, its constants are typed all the same.
	conf := types.Config{Importer: importer.Default(), Error: func(error) {}}
	pkg, _ := conf.Check("engine", fset, []*ast.File{f}, nil)
	kind := pkg.Scope().Lookup("EventKind").Type()
	var kinds []string
	for _, name := range pkg.Scope().Names() {
		c, ok := pkg.Scope().Lookup(name).(*types.Const)
		if !ok || !types.Identical(c.Type(), kind) {
			continue
		}
		kinds = append(kinds, name)
		k, _ := constant.Uint64Val(c.Val())
		h := &HookCalls{}
		var logged strings.Builder
		o, err := newObserver([]Hook{h}, slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})), 0)
		if err != nil {
			t.Fatal(err)
		}
		o.Observe(&engine.Event{Kind: engine.EventKind(k), Topic: "orders", Group: "billing", Err: errors.New("test")})
		if len(h.Called()) == 0 {
			t.Errorf("engine.%s (%d) raises no hook", name, k)
		}
		if logged.Len() == 0 {
			t.Errorf("engine.%s (%d) logs nothing", name, k)
		}
	}
	if len(kinds) < 10 {
		t.Errorf("found %d event kinds in engine/observe.go (%v); want them all", len(kinds), kinds)
	}
}
