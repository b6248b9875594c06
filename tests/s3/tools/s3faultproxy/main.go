// s3faultproxy sits between the S3 source under test and a real S3 server
// (versitygw) and injects what object storage does under load: throttling
// (503 SlowDown with an S3 XML error body), other error answers, and added
// latency. Everything else is passed through unchanged, the Host header
// included, so Signature Version 4 signatures stay valid.
//
//	s3faultproxy --upstream http://127.0.0.1:PORT --listen 127.0.0.1:0 \
//	    --admin 127.0.0.1:0 --ready-file FILE
//
// The admin address (plain HTTP, loopback only) takes:
//
//	POST /inject?status=N&count=C[&code=SlowDown][&prefix=P]  the next C requests (whose
//	                                            path starts with P) are answered with N
//	POST /latency?ms=N                          delays every request by N ms (0: none)
//	POST /clear                                 drops injections and latency
//	GET  /answered                              requests answered by injection so far
//	GET  /requests                              requests seen so far
//
// When both listeners are up it writes "PROXY_ADDR ADMIN_ADDR" to --ready-file.
package main

import (
	"encoding/xml"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

type injection struct {
	prefix    string
	status    int
	code      string
	remaining int
}

type proxy struct {
	mu         sync.Mutex
	injections []*injection
	latency    time.Duration
	answered   int64
	requests   int64
	upstream   *httputil.ReverseProxy
}

type s3Error struct {
	XMLName   xml.Name `xml:"Error"`
	Code      string   `xml:"Code"`
	Message   string   `xml:"Message"`
	Resource  string   `xml:"Resource"`
	RequestID string   `xml:"RequestId"`
}

func (p *proxy) take(path string) *injection {
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

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	latency := p.latency
	p.mu.Unlock()
	if latency > 0 {
		time.Sleep(latency)
	}
	if in := p.take(r.URL.Path); in != nil {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(in.status)
		body, _ := xml.Marshal(s3Error{Code: in.code, Message: "injected by s3faultproxy", Resource: r.URL.Path,
			RequestID: strconv.FormatInt(time.Now().UnixNano(), 36)})
		w.Write(append([]byte(xml.Header), body...))
		return
	}
	p.upstream.ServeHTTP(w, r)
}

func (p *proxy) admin() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /inject", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		status, err1 := strconv.Atoi(q.Get("status"))
		count, err2 := strconv.Atoi(q.Get("count"))
		if err1 != nil || err2 != nil || count < 1 || status < 400 {
			http.Error(w, "inject needs status >= 400 and count >= 1", http.StatusBadRequest)
			return
		}
		code := q.Get("code")
		if code == "" {
			code = "InternalError"
		}
		p.mu.Lock()
		p.injections = append(p.injections, &injection{q.Get("prefix"), status, code, count})
		p.mu.Unlock()
	})
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
	mux.HandleFunc("POST /clear", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.injections = nil
		p.latency = 0
		p.mu.Unlock()
	})
	count := func(get func() int64) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			p.mu.Lock()
			n := get()
			p.mu.Unlock()
			fmt.Fprintf(w, "%d\n", n)
		}
	}
	mux.HandleFunc("GET /answered", count(func() int64 { return p.answered }))
	mux.HandleFunc("GET /requests", count(func() int64 { return p.requests }))
	return mux
}

func main() {
	upstreamURL := flag.String("upstream", "", "the S3 server (http://127.0.0.1:PORT)")
	listen := flag.String("listen", "127.0.0.1:0", "address for clients")
	adminAddr := flag.String("admin", "127.0.0.1:0", "address of the fault-control API")
	readyFile := flag.String("ready-file", "", "where to write \"PROXY_ADDR ADMIN_ADDR\" once listening")
	flag.Parse()
	target, err := url.Parse(*upstreamURL)
	if err != nil || target.Scheme != "http" || target.Host == "" {
		log.Fatalf("s3faultproxy: --upstream must be http://HOST:PORT, got %q", *upstreamURL)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}
	rp.ErrorLog = log.New(os.Stderr, "s3faultproxy: ", log.LstdFlags)
	p := &proxy{upstream: rp}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("s3faultproxy: --listen %s: %v", *listen, err)
	}
	aln, err := net.Listen("tcp", *adminAddr)
	if err != nil {
		log.Fatalf("s3faultproxy: --admin %s: %v", *adminAddr, err)
	}
	go func() { log.Fatal(http.Serve(aln, p.admin())) }()
	if *readyFile != "" {
		tmp := *readyFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(ln.Addr().String()+" "+aln.Addr().String()+"\n"), 0o644); err != nil {
			log.Fatalf("s3faultproxy: %v", err)
		}
		if err := os.Rename(tmp, *readyFile); err != nil {
			log.Fatalf("s3faultproxy: %v", err)
		}
	}
	log.Fatal(http.Serve(ln, p))
}
