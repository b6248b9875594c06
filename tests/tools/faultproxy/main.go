// faultproxy sits between a client under test and a real server and
// injects the faults a production server shows under load: error answers
// (429 with Retry-After, 500, 503 SlowDown, 403, ...), added latency, and
// long-lived (watch) streams cut in the middle. Everything else is passed
// through unchanged, the Host header included. It has two modes, chosen by
// the upstream's scheme:
//
// In front of kube-apiserver (TLS): an https:// upstream and the control
// plane's pki directory.
//
//	faultproxy --upstream https://127.0.0.1:6443 --pki DIR/pki \
//	    --listen 127.0.0.1:0 --admin 127.0.0.1:0 --ready-file FILE
//
// Clients talk TLS to it with the control plane's CA (it serves the
// apiserver's own certificate, whose names include 127.0.0.1). A client
// that authenticates with a bearer token has its Authorization header passed
// on unchanged; one that presents a client certificate (checked against the
// CA) is passed on by impersonation (Impersonate-User and Impersonate-Group
// from the certificate's CN and O), the proxy itself authenticating as the
// admin: the apiserver authorizes and audits the client's own identity
// (audit events name it as impersonatedUser). Injected errors are
// Kubernetes Status objects (JSON).
//
// In front of an S3 server (plain HTTP): an http:// upstream and no --pki.
//
//	faultproxy --upstream http://127.0.0.1:PORT --errors s3 \
//	    --listen 127.0.0.1:0 --admin 127.0.0.1:0 --ready-file FILE
//
// Clients talk plain HTTP to it; requests go on byte for byte (Signature
// Version 4 signatures stay valid: the Host header is the one the client
// signed). Injected errors are S3 XML error bodies
// (<Error><Code>SlowDown</Code>...).
//
// --errors picks the error body: "kubernetes" (the default with --pki) or
// "s3" (the default for an http:// upstream).
//
// The admin address (plain HTTP, loopback only) takes, in both modes:
//
//	POST /inject?status=N&count=C[&prefix=P][&retryAfter=S][&code=X]
//	                       the next C requests whose path starts with P (any
//	                       path without P) are answered with N; Retry-After: S
//	                       when S > 0; X is the S3 error <Code> (default
//	                       InternalError) or the Kubernetes Status reason
//	                       (default: the one for N)
//	POST /clear            drops the injections not yet answered
//	POST /reset            drops the injections not yet answered and the latency
//	GET  /pending          injections not yet answered (a number)
//	GET  /answered         requests answered by injection so far (a number)
//	GET  /requests         requests seen so far (a number)
//	POST /latency?ms=N     delays every request by N ms (0: none)
//	POST /cut-watches      ends every open watch stream (the client sees the stream end)
//	GET  /watches          watch requests (?watch=true) begun so far (a number)
//
// When both listeners are up it writes "PROXY_ADDR ADMIN_ADDR" to
// --ready-file.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/xml"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The error bodies the proxy answers with (--errors).
const (
	errorsKubernetes = "kubernetes"
	errorsS3         = "s3"
)

type injection struct {
	prefix     string
	status     int
	code       string // the S3 <Code> or the Kubernetes reason; "" for the default
	remaining  int
	retryAfter int
}

type proxy struct {
	mu         sync.Mutex
	injections []*injection
	latency    time.Duration
	answered   int64
	requests   int64
	watches    int64
	cancels    map[int64]context.CancelFunc
	nextWatch  int64
	upstream   *httputil.ReverseProxy
	tls        bool   // clients talk TLS; client certificates become impersonation
	errors     string // errorsKubernetes or errorsS3
}

func reasonFor(code int) string {
	switch code {
	case 400:
		return "BadRequest"
	case 401:
		return "Unauthorized"
	case 403:
		return "Forbidden"
	case 404:
		return "NotFound"
	case 409:
		return "Conflict"
	case 410:
		return "Expired"
	case 429:
		return "TooManyRequests"
	case 503:
		return "ServiceUnavailable"
	case 504:
		return "Timeout"
	default:
		return "InternalError"
	}
}

type s3Error struct {
	XMLName   xml.Name `xml:"Error"`
	Code      string   `xml:"Code"`
	Message   string   `xml:"Message"`
	Resource  string   `xml:"Resource"`
	RequestID string   `xml:"RequestId"`
}

// takeInjection counts the request and returns the injection that answers
// it, if any.
func (p *proxy) takeInjection(path string) *injection {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests++
	for i, in := range p.injections {
		if strings.HasPrefix(path, in.prefix) {
			in.remaining--
			if in.remaining <= 0 {
				p.injections = append(p.injections[:i], p.injections[i+1:]...)
			}
			p.answered++
			c := *in
			return &c
		}
	}
	return nil
}

// answer writes the injected error in the body format of --errors.
func (p *proxy) answer(w http.ResponseWriter, r *http.Request, in *injection) {
	if in.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(in.retryAfter))
	}
	if p.errors == errorsS3 {
		code := in.code
		if code == "" {
			code = "InternalError"
		}
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(in.status)
		body, _ := xml.Marshal(s3Error{Code: code, Message: "injected by faultproxy", Resource: r.URL.Path,
			RequestID: strconv.FormatInt(time.Now().UnixNano(), 36)})
		w.Write(append([]byte(xml.Header), body...))
		return
	}
	reason := in.code
	if reason == "" {
		reason = reasonFor(in.status)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(in.status)
	json.NewEncoder(w).Encode(map[string]any{
		"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{}, "status": "Failure",
		"message": fmt.Sprintf("injected by faultproxy: %d for %s", in.status, r.URL.Path),
		"reason":  reason, "code": in.status,
	})
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	latency := p.latency
	p.mu.Unlock()
	if latency > 0 {
		time.Sleep(latency)
	}
	if in := p.takeInjection(r.URL.Path); in != nil {
		p.answer(w, r, in)
		return
	}
	if p.tls {
		// Identity: a bearer token goes on as it is; a client certificate by impersonation.
		r.Header.Del("Impersonate-User")
		r.Header.Del("Impersonate-Group")
		if r.Header.Get("Authorization") == "" && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			cert := r.TLS.PeerCertificates[0]
			r.Header.Set("Impersonate-User", cert.Subject.CommonName)
			for _, g := range cert.Subject.Organization {
				r.Header.Add("Impersonate-Group", g)
			}
		}
	}
	if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
		ctx, cancel := context.WithCancel(r.Context())
		p.mu.Lock()
		p.watches++
		id := p.nextWatch
		p.nextWatch++
		p.cancels[id] = cancel
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			delete(p.cancels, id)
			p.mu.Unlock()
			cancel()
		}()
		r = r.WithContext(ctx)
	}
	p.upstream.ServeHTTP(w, r)
}

func (p *proxy) admin() http.Handler {
	mux := http.NewServeMux()
	number := func(get func() int64) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			p.mu.Lock()
			n := get()
			p.mu.Unlock()
			fmt.Fprintf(w, "%d\n", n)
		}
	}
	mux.HandleFunc("POST /inject", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		status, err1 := strconv.Atoi(q.Get("status"))
		count, err2 := strconv.Atoi(q.Get("count"))
		retry := 0
		if s := q.Get("retryAfter"); s != "" {
			retry, _ = strconv.Atoi(s)
		}
		if err1 != nil || err2 != nil || count < 1 || status < 400 {
			http.Error(w, "inject needs status >= 400 and count >= 1", http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		p.injections = append(p.injections, &injection{
			prefix: q.Get("prefix"), status: status, code: q.Get("code"), remaining: count, retryAfter: retry})
		p.mu.Unlock()
	})
	mux.HandleFunc("POST /clear", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.injections = nil
		p.mu.Unlock()
	})
	mux.HandleFunc("POST /reset", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.injections = nil
		p.latency = 0
		p.mu.Unlock()
	})
	mux.HandleFunc("GET /pending", number(func() int64 {
		n := 0
		for _, in := range p.injections {
			n += in.remaining
		}
		return int64(n)
	}))
	mux.HandleFunc("GET /answered", number(func() int64 { return p.answered }))
	mux.HandleFunc("GET /requests", number(func() int64 { return p.requests }))
	mux.HandleFunc("POST /latency", func(w http.ResponseWriter, r *http.Request) {
		ms, err := strconv.Atoi(r.URL.Query().Get("ms"))
		if err != nil || ms < 0 {
			http.Error(w, "latency needs ms >= 0", http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		p.latency = time.Duration(ms) * time.Millisecond
		p.mu.Unlock()
	})
	mux.HandleFunc("POST /cut-watches", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		n := len(p.cancels)
		for _, c := range p.cancels {
			c()
		}
		p.mu.Unlock()
		fmt.Fprintf(w, "%d\n", n)
	})
	mux.HandleFunc("GET /watches", number(func() int64 { return p.watches }))
	return mux
}

// tlsMode loads the control plane's pki: the transport to kube-apiserver
// (as the admin) and the server's TLS configuration (the apiserver's own
// certificate; client certificates checked against the CA).
func tlsMode(pki string) (*http.Transport, *tls.Config) {
	caPEM, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
	if err != nil {
		log.Fatalf("faultproxy: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		log.Fatalf("faultproxy: no certificate in %s/ca.crt", pki)
	}
	serving, err := tls.LoadX509KeyPair(filepath.Join(pki, "apiserver.crt"), filepath.Join(pki, "apiserver.key"))
	if err != nil {
		log.Fatalf("faultproxy: %v", err)
	}
	admin, err := tls.LoadX509KeyPair(filepath.Join(pki, "admin.crt"), filepath.Join(pki, "admin.key"))
	if err != nil {
		log.Fatalf("faultproxy: %v", err)
	}
	transport := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{admin}},
		ForceAttemptHTTP2:   false,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	server := &tls.Config{
		Certificates: []tls.Certificate{serving},
		ClientCAs:    pool,
		ClientAuth:   tls.VerifyClientCertIfGiven,
		NextProtos:   []string{"http/1.1"},
	}
	return transport, server
}

func main() {
	upstreamURL := flag.String("upstream", "",
		"the server: https://HOST:PORT (kube-apiserver, with --pki) or http://HOST:PORT (plain HTTP, e.g. an S3 server)")
	pki := flag.String("pki", "",
		"the control plane's pki directory (ca.crt, apiserver.crt/key, admin.crt/key); required for an https:// upstream")
	errorsFlag := flag.String("errors", "",
		"the body of injected errors: kubernetes (a Status, JSON) or s3 (an S3 XML Error); "+
			"default kubernetes with --pki, s3 for an http:// upstream")
	listen := flag.String("listen", "127.0.0.1:0", "address for clients (TLS with --pki, plain HTTP without)")
	adminAddr := flag.String("admin", "127.0.0.1:0", "address of the fault-control API (plain HTTP)")
	readyFile := flag.String("ready-file", "", "where to write \"PROXY_ADDR ADMIN_ADDR\" once listening")
	flag.Parse()
	if *upstreamURL == "" {
		log.Fatal("faultproxy: --upstream is required")
	}
	target, err := url.Parse(*upstreamURL)
	if err != nil {
		log.Fatalf("faultproxy: --upstream: %v", err)
	}
	if target.Host == "" {
		log.Fatalf("faultproxy: --upstream must be https://HOST:PORT or http://HOST:PORT, got %q", *upstreamURL)
	}
	var useTLS bool
	switch target.Scheme {
	case "https":
		if *pki == "" {
			log.Fatal("faultproxy: an https:// --upstream needs --pki")
		}
		useTLS = true
	case "http":
		if *pki != "" {
			log.Fatal("faultproxy: --pki is for an https:// --upstream (kube-apiserver); an http:// one is plain HTTP")
		}
	default:
		log.Fatalf("faultproxy: --upstream must be https://HOST:PORT or http://HOST:PORT, got %q", *upstreamURL)
	}
	errorsBody := *errorsFlag
	switch errorsBody {
	case "":
		errorsBody = errorsS3
		if useTLS {
			errorsBody = errorsKubernetes
		}
	case errorsKubernetes, errorsS3:
	default:
		log.Fatalf("faultproxy: --errors must be %s or %s, got %q", errorsKubernetes, errorsS3, errorsBody)
	}

	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1 // watch events and object bytes go through as they come
	rp.ErrorLog = log.New(os.Stderr, "faultproxy: ", log.LstdFlags)
	srv := &http.Server{ErrorLog: log.New(os.Stderr, "faultproxy: ", log.LstdFlags)}
	if useTLS {
		rp.Transport, srv.TLSConfig = tlsMode(*pki)
	} else {
		rp.Transport = &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}
	}
	p := &proxy{cancels: map[int64]context.CancelFunc{}, upstream: rp, tls: useTLS, errors: errorsBody}
	srv.Handler = p

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("faultproxy: --listen %s: %v", *listen, err)
	}
	aln, err := net.Listen("tcp", *adminAddr)
	if err != nil {
		log.Fatalf("faultproxy: --admin %s: %v", *adminAddr, err)
	}
	go func() { log.Fatal(http.Serve(aln, p.admin())) }()
	if *readyFile != "" {
		tmp := *readyFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(ln.Addr().String()+" "+aln.Addr().String()+"\n"), 0o644); err != nil {
			log.Fatalf("faultproxy: %v", err)
		}
		if err := os.Rename(tmp, *readyFile); err != nil {
			log.Fatalf("faultproxy: %v", err)
		}
	}
	if useTLS {
		log.Fatal(srv.ServeTLS(ln, "", ""))
	}
	log.Fatal(srv.Serve(ln))
}
