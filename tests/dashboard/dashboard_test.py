#!/usr/bin/python3
"""The registry's dashboard in a real headless browser.

    dashboard_test.py BIN_DIR [SCREENSHOT_DIR]

Starts `troupe registry --http` (with a short history interval) and two replicas of
troupe_test_host_actor (job "dash"), a job of two replicas through `troupe launch` (job "lj"),
and two short jobs that succeed and fail; opens the dashboard in Debian's chromium through a
chromedriver of its own, and checks that it shows the endpoints live, jobs in order (running
first, then ended ones, the latest first) with their outcome and end time, each job's traffic
chart from the registry's history, a job's page (replicas with state, pid, host and restarts,
resources, events, the last log lines, charts per job and per endpoint), an endpoint's history
and metrics, a killed replica's row going away without a reload, an endpoint's hostile metadata
as plain text, and, on a registry with a cluster token, the token form alone. Saves a
screenshot of each page (overview, job, endpoint, token) as PNG in SCREENSHOT_DIR (default: a
"dashboard-screenshots" folder beside BIN_DIR) for a person to look at. Every port is 0 and
read back; every wait is on the condition itself, with a deadline; every process started here
is stopped by its pid. Prints one line per check and exits 0 only when all of them passed.
"""

import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from selenium import webdriver
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
START_TIMEOUT = 30  # seconds for a process to say it is up
WAIT_TIMEOUT = 20   # seconds for the page to show what it should
EVIL = '<img src=x onerror="window.__xss=1"><b>bold</b>'


class CheckFailed(Exception):
    pass


class Process:
    """A child process whose stdout lines are read on a thread, so they can be awaited with a
    deadline; its stderr goes to a log file, printed when the test fails."""

    def __init__(self, name, args, log_dir, env=None):
        self.name = name
        self.log_path = os.path.join(log_dir, name + ".log")
        self.lines = queue.Queue()
        self.seen = []
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=log, env=env)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.popen.stdout:
            self.lines.put(raw.decode("utf-8", "replace").rstrip("\n"))
        self.lines.put(None)

    def wait_line(self, prefix, timeout=START_TIMEOUT):
        """The first stdout line starting with `prefix`, waiting at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        for line in self.seen:
            if line.startswith(prefix):
                return line
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CheckFailed(f"{self.name} printed no '{prefix}' line in {timeout} s")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise CheckFailed(f"{self.name} exited ({self.popen.wait()}) before '{prefix}'")
            self.seen.append(line)
            if line.startswith(prefix):
                return line

    def stop(self, sig=signal.SIGTERM, timeout=10):
        """Signals the process (its own pid only) and reaps it; SIGKILL when it lingers."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                print(f"  {self.name} ignored signal {sig} for {timeout} s; killing it")
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode

    def log_tail(self):
        return Process.tail(self.log_path)

    @staticmethod
    def tail(path, lines=30):
        with open(path, "rb") as log:
            text = log.read().decode("utf-8", "replace").splitlines()
        return "\n".join(text[-lines:])


class DashboardTest:
    def __init__(self, bin_dir, tmp, screenshots):
        self.bin_dir = bin_dir
        self.tmp = tmp
        self.screenshots = screenshots
        self.processes = []
        self.driver = None
        self.env = dict(os.environ)  # what every child starts from

    def start(self, name, args, env=None):
        process = Process(name, args, self.tmp, env)
        self.processes.append(process)
        return process

    def passed(self, what):
        print(f"PASS  {what}", flush=True)

    def check(self, what, ok, detail=""):
        if not ok:
            raise CheckFailed(f"{what}{': ' + detail if detail else ''}")
        self.passed(what)

    def wait(self, what, condition, timeout=WAIT_TIMEOUT):
        """Waits until `condition(driver)` is truthy and returns it; fails the check otherwise."""
        try:
            result = WebDriverWait(self.driver, timeout, poll_frequency=0.1).until(condition)
        except TimeoutException:
            raise CheckFailed(f"{what} (not within {timeout} s)")
        self.passed(what)
        return result

    def js(self, script, *args):
        return self.driver.execute_script(script, *args)

    # ---- Setting up.

    def troupe(self, *args):
        return [os.path.join(self.bin_dir, "troupe"), *args]

    def screenshot(self, name):
        os.makedirs(self.screenshots, exist_ok=True)
        path = os.path.join(self.screenshots, name + ".png")
        self.driver.set_window_size(1200, 900)
        height = self.js("return document.documentElement.scrollHeight")
        self.driver.set_window_size(1200, max(900, min(int(height) + 140, 6000)))
        self.check(f"a screenshot of the {name} page is saved",
                   self.driver.save_screenshot(path) and os.path.getsize(path) > 0, path)

    def start_registry(self):
        registry = self.start("registry", self.troupe("registry", "--listen", "tcp://127.0.0.1:0",
                                                      "--http", "127.0.0.1:0",
                                                      "--history-interval", "500ms"), self.env)
        self.registry_address = registry.wait_line("LISTENING ").split(" ", 1)[1]
        self.http = registry.wait_line("HTTP ").split(" ", 1)[1].rstrip("/")
        self.check("registry listens on 127.0.0.1",
                   self.registry_address.startswith("tcp://127.0.0.1:")
                   and self.http.startswith("http://127.0.0.1:"),
                   f"{self.registry_address} {self.http}")
        self.registry = registry
        self.resolver = "registry://" + self.registry_address[len("tcp://"):]

    def start_replica(self, index):
        env = dict(self.env, TROUPE_RESOLVER=self.resolver, TROUPE_JOB_ID="dash",
                   TROUPE_TASK_INDEX=str(index), TROUPE_NUM_TASKS="2",
                   TROUPE_METRICS="127.0.0.1:0")
        return self.start(f"replica-{index}",
                          [os.path.join(self.bin_dir, "troupe_test_host_actor")], env)

    def launch(self, name, replicas, binary, wait_for):
        """`troupe launch` of `replicas` replicas of `binary` as job `name`."""
        env = dict(self.env, TROUPE_METRICS="127.0.0.1:0")
        process = self.start(f"launch-{name}", self.troupe(
            "launch", "--resolver", self.resolver, "--name", name, "--replicas", str(replicas),
            "--ram", "64Mi", "--log-dir", os.path.join(self.tmp, "logs"), "--", binary), env)
        process.wait_line(wait_for)
        return process

    def make_calls(self, target, count):
        for _ in range(count):
            subprocess.run(self.troupe("call", "--resolver", self.resolver, target,
                                       "member.whoami"),
                           env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=30, check=True)

    def start_browser(self):
        self.chromedriver_log = os.path.join(self.tmp, "chromedriver-verbose.log")
        driver = self.start("chromedriver", [CHROMEDRIVER, "--port=0",
                                             "--log-path=" + self.chromedriver_log], self.env)
        line = driver.wait_line("ChromeDriver was started successfully on port ")
        port = int(line.rsplit(" ", 1)[1].rstrip("."))
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    f"--user-data-dir={os.path.join(self.tmp, 'chromium-profile')}",
                    "--no-first-run", "--no-default-browser-check", "--no-proxy-server",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--disable-extensions", "--disable-default-apps",
                    # Any host but 127.0.0.1 fails to resolve: the page may reach nothing else.
                    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                    "--window-size=1200,900"]:
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Remote(command_executor=f"http://127.0.0.1:{port}",
                                       options=options)

    # ---- The checks.

    def row(self, name):
        return f'[data-endpoint="{name}"]'

    def connection_live(self, driver):
        return driver.execute_script(
            "const c = document.getElementById('connection'); return c && c.textContent;") == "live"

    def rows_present(self, *names):
        return lambda d: all(d.find_elements(By.CSS_SELECTOR, self.row(n)) for n in names)

    def chart_points(self, selector):
        """The samples the first chart under `selector` draws, or 0 when there is none."""
        return self.js("const c = document.querySelector(arguments[0]);"
                       "return c ? Number(c.dataset.points) : 0;", selector)

    def job_order(self):
        return self.js("return Array.from(document.querySelectorAll('#jobs > .job'))"
                       ".map((s) => s.dataset.job);")

    def marker_unchanged(self):
        self.check("the page did not reload", self.js("return window.__loaded") == self.marker,
                   f"window.__loaded is {self.js('return window.__loaded')!r}")

    def overview(self):
        self.driver.get(self.http + "/")
        self.wait("#connection says live", self.connection_live)
        self.wait("rows for dash/member-0 and dash/member-1",
                  self.rows_present("dash/member-0", "dash/member-1"))
        section = self.driver.find_elements(By.CSS_SELECTOR, '[data-job="dash"]')
        self.check("a section for job dash", len(section) == 1)
        self.marker = secrets.token_hex(8)
        self.js("window.__loaded = arguments[0];", self.marker)

    def overview_history_and_order(self):
        self.make_calls("dash/", 20)
        self.wait("job dash's traffic chart has samples from the registry's history",
                  lambda d: self.chart_points('[data-job="dash"] .spark .chart') >= 2)
        self.check("its path is drawn",
                   bool(self.driver.find_elements(By.CSS_SELECTOR,
                                                  '[data-job="dash"] .spark path.line.calls')))
        self.wait("the job that succeeded shows a green 'succeeded' badge with its end time",
                  lambda d: self.js(
                      "const s = document.querySelector('[data-job=\"ok-job\"]');"
                      "return s && s.querySelector('.job-state').className.includes('job-succeeded')"
                      " && s.querySelector('.ended').textContent.startsWith('ended ');"))
        self.wait("the job that failed shows a red 'failed' badge",
                  lambda d: self.js(
                      "const s = document.querySelector('[data-job=\"bad-job\"]');"
                      "return s && s.querySelector('.job-state').className.includes('job-failed')"
                      " && s.querySelector('.job-state').textContent === 'failed';"))
        color = self.js("return getComputedStyle(document.querySelector("
                        "'[data-job=\"bad-job\"] .job-state')).color")
        self.check("the failed badge is red", color == "rgb(180, 35, 24)", color)
        order = self.job_order()
        self.check("running jobs come first, then ended ones, the latest ended first",
                   order.index("dash") < order.index("bad-job")
                   and order.index("lj") < order.index("bad-job")
                   and order.index("bad-job") < order.index("ok-job"), repr(order))
        self.screenshot("overview")

    def job_page(self):
        self.make_calls("lj/", 20)
        self.driver.find_element(By.CSS_SELECTOR, '[data-job="lj"] .job-id a').click()
        self.wait("the page of job lj opens",
                  lambda d: d.execute_script("return location.hash") == "#/job/lj"
                  and d.find_element(By.ID, "job-view").is_displayed())
        self.wait("its replicas are listed running, with pids, host and restarts",
                  lambda d: self.js(
                      "const rows = document.querySelectorAll('#replicas-body tr');"
                      "return rows.length === 2 && Array.from(rows).every((r) =>"
                      " r.cells[1].textContent === 'running' && /^[0-9]+$/.test(r.cells[2].textContent)"
                      " && r.cells[3].textContent !== '–' && r.cells[4].textContent === '0');"))
        pids = self.js("return Array.from(document.querySelectorAll('#replicas-body tr'))"
                       ".map((r) => Number(r.cells[2].textContent));")
        launched = sorted(int(line.rsplit(" ", 1)[1]) for line in self.lj.seen
                          if line.startswith("  replica ") and ", pid " in line)
        self.check("the pids are those troupe launch started", sorted(pids) == launched[-2:],
                   f"{pids} vs {launched}")
        fields = self.js("return document.getElementById('job-fields').textContent")
        self.check("its resources and launcher are shown",
                   "64 MiB memory" in fields and "local" in fields, fields)
        self.wait("its events say how it was created and its replicas registered",
                  lambda d: "created by a local launcher, 2 replica(s)" in self.js(
                      "return document.getElementById('job-events').textContent")
                  and "lj/member-1 is ready" in self.js(
                      "return document.getElementById('job-events').textContent"))
        self.wait("the last lines of each replica's log are shown",
                  lambda d: self.js(
                      "const logs = document.querySelectorAll('#job-logs .log pre');"
                      "return logs.length === 2 && logs[1].textContent.includes("
                      "'troupe: job lj, replica 1, start 1');"))
        self.wait("charts for the job and for each endpoint have samples",
                  lambda d: self.chart_points('#job-charts .chart') >= 2
                  and self.chart_points('[data-endpoint="lj/member-0"] .chart') >= 2
                  and self.chart_points('[data-endpoint="lj/member-1"] .chart') >= 2)
        self.wait("the job's traffic shows the calls made",
                  lambda d: self.js(
                      "return Array.from(document.querySelectorAll('#job-charts path.line.calls'))"
                      ".length > 0;"))
        self.screenshot("job")
        self.driver.back()
        self.wait("back on the overview from the job page",
                  lambda d: d.find_element(By.ID, "overview").is_displayed())

    def token_page(self):
        token_file = os.path.join(self.tmp, "cluster-token")
        with open(token_file, "w") as f:
            f.write(secrets.token_hex(16))
        os.chmod(token_file, 0o600)
        registry = self.start("registry-token", self.troupe(
            "registry", "--listen", "tcp://127.0.0.1:0", "--http", "127.0.0.1:0",
            "--token-file", token_file), self.env)
        http = registry.wait_line("HTTP ").split(" ", 1)[1].rstrip("/")
        self.driver.get(http + "/")
        self.wait("behind a cluster token, the token form shows",
                  lambda d: d.find_element(By.ID, "token-form").is_displayed())
        self.check("and nothing else: no 'No jobs registered.' under it",
                   not self.driver.find_element(By.ID, "no-jobs").is_displayed()
                   and not self.driver.find_element(By.ID, "views").is_displayed())
        self.screenshot("token")

    def endpoint_page(self):
        link = self.driver.find_element(By.CSS_SELECTOR, self.row("dash/member-0") + " a")
        link.click()
        self.wait("the endpoint page of dash/member-0 opens",
                  lambda d: d.execute_script("return location.hash")
                  == "#/endpoint/" + "dash%2Fmember-0")
        self.wait("a metrics row for member.whoami",
                  lambda d: d.find_elements(
                      By.CSS_SELECTOR, 'tr[data-actor="member"][data-method="whoami"]'))
        self.wait("the endpoint's history charts have samples",
                  lambda d: self.chart_points('#endpoint-history .chart') >= 2)
        self.screenshot("endpoint")
        self.driver.back()
        self.wait("back on the overview",
                  lambda d: d.find_element(By.ID, "overview").is_displayed()
                  and d.find_elements(By.CSS_SELECTOR, self.row("dash/member-1")))
        self.marker_unchanged()

    def kill_replica(self, replica):
        replica.stop(signal.SIGKILL)
        self.passed(f"replica 1 killed (pid {replica.popen.pid})")
        self.wait("the dash/member-1 row turns gone",
                  lambda d: d.execute_script(
                      "const r = document.querySelector(arguments[0]);"
                      "return r === null || r.classList.contains('gone');",
                      self.row("dash/member-1")))
        self.wait("the dash/member-1 row leaves the page",
                  lambda d: not d.find_elements(By.CSS_SELECTOR, self.row("dash/member-1")))
        self.check("the dash/member-0 row stays",
                   bool(self.driver.find_elements(By.CSS_SELECTOR, self.row("dash/member-0"))))
        self.marker_unchanged()

    def hostile_metadata(self):
        registrant = self.start("registrant", [
            os.path.join(self.bin_dir, "troupe_test_registrant"), self.resolver, "dash/evil-0",
            "--metadata", "note=" + EVIL], self.env)
        registrant.wait_line("REGISTERED ")
        self.wait("a row for dash/evil-0", self.rows_present("dash/evil-0"))
        self.driver.find_element(By.CSS_SELECTOR, self.row("dash/evil-0") + " a").click()
        note = self.wait("the note of dash/evil-0 is shown",
                         lambda d: d.find_elements(
                             By.CSS_SELECTOR, '#endpoint-metadata [data-meta-key="note"]'))[0]
        self.check("the note is shown literally, as text",
                   note.get_property("textContent") == EVIL, repr(note.get_property("textContent")))
        self.wait("the metrics status says why there are none",
                  lambda d: "metrics unavailable" in
                  d.find_element(By.ID, "metrics-status").get_property("textContent"))
        count = self.js("return document.querySelectorAll('#content img, #content b').length")
        self.check("no <img> or <b> element in the page's content", count == 0, f"{count} found")
        self.check("window.__xss is undefined",
                   self.js("return typeof window.__xss") == "undefined")
        self.marker_unchanged()

    def console_clean(self):
        bad = [entry["message"] for entry in self.driver.get_log("browser")
               if "Content Security Policy" in entry["message"] or "Uncaught" in entry["message"]]
        self.check("no CSP violation or uncaught error in the console", not bad, "; ".join(bad))

    def run(self):
        self.start_registry()
        replicas = [self.start_replica(i) for i in range(2)]
        self.lj = self.launch("lj", 2, os.path.join(self.bin_dir, "troupe_test_host_actor"),
                              "  replica 1: running")
        for name, binary in [("ok-job", "/bin/true"), ("bad-job", "/bin/false")]:
            done = self.launch(name, 1, binary, f"job {name}: ")
            done.popen.wait(timeout=START_TIMEOUT)
        self.start_browser()
        self.overview()
        self.overview_history_and_order()
        self.job_page()
        self.endpoint_page()
        self.kill_replica(replicas[1])
        self.hostile_metadata()
        self.token_page()
        self.console_clean()

    def cleanup(self):
        if self.driver is not None:
            try:
                self.driver.quit()
            except WebDriverException as e:
                print(f"  quitting the WebDriver session failed: {e}")
        # The registry last, so the replicas need not notice it going away.
        for process in reversed(self.processes):
            status = process.stop()
            if process.name == "registry" and status != 0:
                raise CheckFailed(f"the registry exited {status} on SIGTERM")


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    bin_dir = os.path.abspath(sys.argv[1])
    screenshots = (os.path.abspath(sys.argv[2]) if len(sys.argv) == 3
                   else os.path.join(os.path.dirname(bin_dir), "dashboard-screenshots"))
    # Nothing goes through a proxy, ours (the WebDriver client) or the children's: every address
    # here is 127.0.0.1.
    for key in list(os.environ):
        if key.lower() in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
            del os.environ[key]
    tmp = tempfile.mkdtemp(prefix="troupe-dashboard-test-")
    test = DashboardTest(bin_dir, tmp, screenshots)
    ok = True
    try:
        test.run()
    except Exception as e:  # a failed check, or anything else: report it, then clean up
        ok = False
        print(f"FAIL  {e}" if isinstance(e, CheckFailed) else f"FAIL  {traceback.format_exc()}",
              flush=True)
        for process in test.processes:
            print(f"---- {process.name} stderr (last lines) ----\n{process.log_tail()}")
        if os.path.exists(getattr(test, "chromedriver_log", "")):
            print(f"---- chromedriver log (last lines) ----\n"
                  f"{Process.tail(test.chromedriver_log)}")
        if test.driver is not None:
            try:
                for entry in test.driver.get_log("browser"):
                    print(f"  console: {entry['level']} {entry['message']}")
            except WebDriverException:
                pass
    finally:
        try:
            test.cleanup()
            if ok:
                test.passed("every process stopped; the registry exited 0")
        except CheckFailed as e:
            ok = False
            print(f"FAIL  {e}", flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print("dashboard test: " + ("all checks passed" if ok else "FAILED"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
