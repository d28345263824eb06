// Package debughttp serves a logbus broker's debug page: an HTML overview
// of its topics, partitions and consumer groups (assignment, lag in records
// and in time, deliveries in flight and stuck handlers) and of the recent
// dead letters, with their errors and sizes, and with [WithPayloads] a safe
// preview of their bytes. The page refreshes itself. Every view is also
// JSON, for ?format=json or an Accept header naming application/json.
//
// Nothing is registered behind the caller's back: mount the handler where
// you want it, under a prefix stripped from the path, and guard it as you
// guard any operator endpoint (it names topics, groups and consumers, and
// shows dead letters' errors):
//
//	mux.Handle("/debug/logbus/", http.StripPrefix("/debug/logbus", debughttp.Handler(b)))
//
// # Views
//
// Routes, relative to where it is mounted:
//
//	GET  /                                  the overview
//	GET  /topics/{topic}                    one topic: its partitions and groups
//	GET  /topics/{topic}/groups/{group}     one group: its partitions and dead letters
//	POST /topics/{topic}/groups/{group}/{action}   pause, resume, replay, redrive, discard or delete
//	POST /topics/{topic}/delete             delete the topic
//
// Every response is bounded, however large the broker: the overview and a
// topic's view summarise groups without their partitions; a topic's and a
// group's views list 256 partitions at a time (?first=N starts at partition
// N; the JSON's "page" says where the next page starts); a group lists at
// most 1024 consumers and each consumer at most 64 of its partitions; a
// dead letter's error is cut at 1 KiB and its headers at 32 (names at 128
// bytes, values at 256); counts beside each say how many there are in all.
// Each request builds only the view it asks for, from one
// [pubsub.Broker.Snapshot] and the newest dead letters of the groups it
// shows (read for at most 5 seconds in all): it never waits for a handler.
//
// An error answers in the format the client asked for: JSON for an Accept
// header naming application/json (or ?format=json), a page for a browser
// (text/html), and otherwise, as for curl, one line of text; 404 and 405
// (with its Allow header) too.
//
// # Actions
//
// The page is read-only unless [WithActions] is given: without it every POST
// is refused with 403 Forbidden. With it, the actions are POST requests
// only (a GET is 405 Method Not Allowed), and cross-origin browser requests
// are refused with 403 (http.CrossOriginProtection), so another site cannot
// make a visitor's browser press the buttons. Requests without the
// browser's Origin and Sec-Fetch-Site headers (curl, scripts) are allowed.
//
// The actions' form fields: replay needs from=earliest, latest, offset
// (with offset=N) or time (with time=RFC 3339), and has no default, so that
// a typo cannot rewind a group; redrive and discard need id=ID (repeated)
// or all=1, and answer how many dead letters they moved. Delete
// ([pubsub.Broker.DeleteGroup], [pubsub.Broker.DeleteTopic]) takes no
// field; the page's buttons that delete or discard ask for confirmation
// first. A browser is sent back to the page that remains (303 See Other),
// which says what was done; a JSON client gets {"ok": true, ...}, anyone
// else a line of text. Actions wait as the methods they call do, at most 5
// seconds; one that reaches that deadline answers 504 Gateway Timeout,
// saying what it did so far, except a deletion, which then took place all
// the same and answers so.
//
// # DNS rebinding
//
// With WithActions or WithPayloads, the handler also refuses with 403
// every request whose Host header is not localhost (or a name under
// .localhost), an IP address, or a name given to [WithAllowedHosts]. This
// stops DNS rebinding: a hostile site whose name is made to resolve to the
// machine running the page passes the cross-origin check (its Origin, Host
// and Sec-Fetch-Site agree), but its Host is still its own name. A token
// in the page, checked on every action, would not stop it: once rebound,
// the hostile page is same-origin with the debug page and can read the
// token from it. IP addresses are allowed because no DNS answer can change
// what they reach. To reach the page by a DNS name, or through a proxy
// that passes the client's Host on, name it with WithAllowedHosts. A
// read-only page without payloads answers any Host: it shows names and
// counts only.
package debughttp

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/logbus/logbus/pubsub"
)

// Handler returns the debug page of b; it panics if b is nil. The handler
// is safe for concurrent use and keeps no state between requests. It
// works after b is closed too: it shows the broker stopped, with what its
// engine still holds (dead letters included, where the engine can read
// them; the page says when it cannot), and refuses actions with 409
// Conflict.
//
// An invalid option (a nil one, or a value its doc calls invalid) does not
// panic, so that a bad configuration value cannot take a program down
// with its debug page: the handler then answers every request with 500
// Internal Server Error and an error naming the options, which wraps
// [pubsub.ErrInvalid].
func Handler(b *pubsub.Broker, opts ...Option) http.Handler {
	if b == nil {
		panic("debughttp: Handler of a nil *pubsub.Broker")
	}
	return newHandler(brokerSource{b}, opts...)
}

// source is what the handler reads and acts on (brokerSource): the page's
// code never touches the broker itself.
type source interface {
	// snapshot describes the broker.
	snapshot() pubsub.Snapshot
	// letters returns a group's newest n dead letters, the newest first;
	// with an error when it could not read them all.
	letters(ctx context.Context, topic, group string, n int) ([]pubsub.DeadLetter[[]byte], error)
	// act applies a; for the actions that count, it returns how many dead
	// letters they moved.
	act(ctx context.Context, a action) (int, error)
}

type handler struct {
	src  source
	cfg  config
	err  error // of the options: every request is answered with it
	mux  *http.ServeMux
	csrf *http.CrossOriginProtection
}

func newHandler(src source, opts ...Option) *handler {
	cfg, err := newConfig(opts)
	h := &handler{src: src, cfg: cfg, err: err, mux: http.NewServeMux(), csrf: http.NewCrossOriginProtection()}
	// The methods are checked here, not by the mux, whose 405 and 404
	// answer in plain text whatever the client asked for.
	h.mux.HandleFunc("/{$}", h.view(h.serveOverview))
	h.mux.HandleFunc("/topics/{topic}", h.view(h.serveTopic))
	h.mux.HandleFunc("/topics/{topic}/groups/{group}", h.view(h.serveGroup))
	h.mux.HandleFunc("/topics/{topic}/{action}", h.serveAction)
	h.mux.HandleFunc("/topics/{topic}/groups/{group}/{action}", h.serveAction)
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { h.notFound(w, r, "no page "+strconv.Quote(r.URL.Path)) })
	return h
}

// view serves GET and HEAD with serve, and refuses other methods.
func (h *handler) view(serve http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			h.fail(w, r, http.StatusMethodNotAllowed, r.Method+" is not allowed here: the views answer GET")
			return
		}
		serve(w, r)
	}
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.err != nil {
		h.fail(w, r, http.StatusInternalServerError, h.err.Error())
		return
	}
	if h.cfg.guarded() && !h.cfg.hostAllowed(r) {
		h.fail(w, r, http.StatusForbidden, fmt.Sprintf("host %q is not allowed: with actions or payloads on, only localhost, IP addresses and the names given to debughttp.WithAllowedHosts are (DNS rebinding)", r.Host))
		return
	}
	if r.URL.Path == "" {
		// Mounted with StripPrefix and asked for the prefix itself: the
		// page's relative links need the trailing slash.
		http.Redirect(w, r, requestPath(r)+"/", http.StatusFound)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// requestPath is the path the client asked for, before any StripPrefix.
func requestPath(r *http.Request) string {
	if u, err := url.ParseRequestURI(r.RequestURI); err == nil {
		return u.EscapedPath()
	}
	return r.URL.EscapedPath()
}

func (h *handler) serveOverview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.timeout) // bounds reading dead letters from a remote engine
	defer cancel()
	o, stuck, numStuck := h.overviewOf(ctx, h.src.snapshot())
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, o)
		return
	}
	h.render(w, r, &page{Title: "logbus", overview: &o, Stuck: stuck, NumStuck: numStuck, Notice: notice(r.URL.Query()), Done: r.URL.Query().Get("done")})
}

func (h *handler) serveTopic(w http.ResponseWriter, r *http.Request) {
	first, err := firstOf(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	snap := h.src.snapshot()
	t, ok := findTopic(snap, r.PathValue("topic"))
	if !ok {
		h.notFound(w, r, fmt.Sprintf("no topic %q", r.PathValue("topic")))
		return
	}
	tv, err := topicPage(t, first)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, tv)
		return
	}
	o := h.head(snap)
	h.render(w, r, &page{Title: "logbus: topic " + visible(t.Name), overview: &o, Topic: &tv, Notice: notice(r.URL.Query()), Done: r.URL.Query().Get("done")})
}

func (h *handler) serveGroup(w http.ResponseWriter, r *http.Request) {
	first, err := firstOf(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	snap := h.src.snapshot()
	t, g, ok := findGroup(snap, r.PathValue("topic"), r.PathValue("group"))
	if !ok {
		h.notFound(w, r, fmt.Sprintf("no group %q on topic %q", r.PathValue("group"), r.PathValue("topic")))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.timeout) // bounds reading dead letters from a remote engine
	defer cancel()
	gv, err := h.groupPage(ctx, t, g, first)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, gv)
		return
	}
	o, tv := h.head(snap), topicOf(t)
	h.render(w, r, &page{Title: "logbus: group " + visible(g.Name) + " on " + visible(t.Name), overview: &o, Topic: &tv, Group: &gv,
		Notice: notice(r.URL.Query()), Done: r.URL.Query().Get("done")})
}

// firstOf reads ?first=N, the first partition a view lists; 0 by default.
func firstOf(r *http.Request) (int, error) {
	s := r.URL.Query().Get("first")
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("first=%q: want a partition number", s)
	}
	return n, nil
}

func (h *handler) notFound(w http.ResponseWriter, r *http.Request, msg string) {
	h.fail(w, r, http.StatusNotFound, msg)
}

// fail answers with an error in the format r asked for: JSON, a page for
// a browser, or else (curl, scripts) a line of text.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	switch formatOf(r) {
	case formatJSON:
		writeJSON(w, code, map[string]string{"error": msg})
	case formatHTML:
		h.render(w, r, &page{Title: "logbus: " + http.StatusText(code), Error: msg, Code: code})
	default:
		writeText(w, code, msg)
	}
}

// format is what a client reads.
type format int

const (
	formatText format = iota // a line of text: curl's default Accept, */*
	formatHTML               // a page: a browser
	formatJSON
)

// formatOf reads what r asks for: ?format=json or html, or the first of
// application/json and text/html (or application/xhtml+xml) in its Accept
// header. A browser names text/html first; curl's */* names neither.
func formatOf(r *http.Request) format {
	switch r.URL.Query().Get("format") {
	case "json":
		return formatJSON
	case "html":
		return formatHTML
	}
	for part := range strings.SplitSeq(r.Header.Get("Accept"), ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch mt {
		case "application/json":
			return formatJSON
		case "text/html", "application/xhtml+xml":
			return formatHTML
		}
	}
	return formatText
}

// wantsJSON reports whether a view should answer r in JSON; else it
// answers with the page, to curl too.
func wantsJSON(r *http.Request) bool { return formatOf(r) == formatJSON }

func writeText(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	// One line, whatever the error says (errors.Join puts its errors on
	// lines of their own).
	_, _ = io.WriteString(w, strings.ReplaceAll(msg, "\n", "; ")+"\n") // the client went away: nothing to do
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away: nothing to do
}

// page is what the template renders.
type page struct {
	Title   string
	Root    string // the relative path from this page to the handler's root, "./" or "../…"
	Nonce   string // of the page's script and style, for its Content-Security-Policy
	Refresh int64  // milliseconds between refreshes; 0 for none
	Actions bool
	Notice  string // the outcome of an action, after its redirect
	Done    string // the action's kind (?done=), for the notice's data-done
	Error   string // an error page's message
	Code    int    // an error page's status; 0 for 200
	*overview
	Topic    *topicView
	Group    *groupView
	Stuck    []stuckView // the first stuckLimit
	NumStuck int
}

//go:embed page.html
var files embed.FS

var tmpl = template.Must(template.New("page.html").Funcs(template.FuncMap{
	"topicHref": func(root, topic string) string { return root + "topics/" + url.PathEscape(topic) },
	"groupHref": func(root, topic, group string) string {
		return root + "topics/" + url.PathEscape(topic) + "/groups/" + url.PathEscape(group)
	},
	"age":   age,
	"minus": func(a, b int) int { return a - b },
	"show":  visible, // a name, as errors and headers are shown
	"plus":  func(a, b int) int { return a + b },
	"ints":  joinInts,
	"list":  func(t *topicView) []topicView { return []topicView{*t} },
	// args passes named values to a nested template: args "Root" .Root
	// "Group" $g.
	"args": func(kv ...any) (map[string]any, error) {
		if len(kv)%2 != 0 {
			return nil, errors.New("args: odd number of arguments")
		}
		m := make(map[string]any, len(kv)/2)
		for i := 0; i < len(kv); i += 2 {
			k, ok := kv[i].(string)
			if !ok {
				return nil, fmt.Errorf("args: key %v is not a string", kv[i])
			}
			m[k] = kv[i+1]
		}
		return m, nil
	},
}).ParseFS(files, "page.html"))

func (h *handler) render(w http.ResponseWriter, r *http.Request, p *page) {
	var nonce [16]byte
	_, _ = rand.Read(nonce[:]) // crypto/rand.Read never fails
	p.Nonce = base64.RawURLEncoding.EncodeToString(nonce[:])
	p.Root = root(r)
	p.Actions = h.cfg.actions
	if p.Error == "" {
		p.Refresh = h.cfg.refresh.Milliseconds()
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'nonce-"+p.Nonce+"'; style-src 'nonce-"+p.Nonce+
		"'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	w.Header().Set("Referrer-Policy", "no-referrer")
	if p.Code != 0 {
		w.WriteHeader(p.Code)
	}
	_ = tmpl.Execute(w, p) // fails only when the client went away
}

// root is the relative path from the page r asked for back to the
// handler's root, whatever prefix it is mounted under.
func root(r *http.Request) string {
	depth := strings.Count(r.URL.EscapedPath(), "/") - 1
	if depth <= 0 {
		return "./"
	}
	return strings.Repeat("../", depth)
}

// age formats seconds for a person: "0", "850ms", "12.3s", "4m05s", "2h13m".
func age(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d <= 0:
		return "0"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

func joinInts(ps []int) string {
	s := make([]string, len(ps))
	for i, p := range slices.Sorted(slices.Values(ps)) {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ", ")
}
