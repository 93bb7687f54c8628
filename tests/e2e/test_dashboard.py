"""The dashboard in a real headless Chromium against the four services as processes.

Debian's chromium is driven by Playwright (`executable_path`: no browser download). Screenshots
of the main pages are saved under `tests/artifacts/` (git-ignored); their paths are printed.
"""

import asyncio
import hashlib
import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import pytest
from playwright.async_api import Browser, Dialog, Page, async_playwright, expect

from shared.store import users_repo
from tests.e2e.conftest import HOST_ID, Events
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

CHROMIUM = os.environ.get("VIGIL_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
HOSTILE_NAME = "<img src=x onerror=alert(1)>"
HOSTILE_INPUT = "<script>alert(2)</script>"
HOSTILE_LINE = "<img src=y onerror=alert(3)>"
LIVE_MS = 30_000  # longest wait for something to show up on a page


@dataclass
class Tab:
    """A signed-in page, with the dialogs it opened and the script errors it raised."""

    page: Page
    prompt_answer: str = ""
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    async def on_dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        if dialog.type == "alert":
            await dialog.dismiss()
        else:
            await dialog.accept(self.prompt_answer)

    async def open(self, path: str) -> None:
        """Go to `path` and wait until its live stream is open (when it has one)."""
        await self.page.goto(path)
        if await self.page.locator("#live").count():
            await expect(self.page.locator("#live")).to_have_attribute("data-state", "on")

    async def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        await self.page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")  # noqa: T201
        return path


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Debian's chromium (`scripts/lib.sh`'s `ensure_chromium` installs it for CI)."""
    found = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if found is None:  # never a silent skip: the browser tests are part of the suite
        pytest.fail(
            f"no chromium at {CHROMIUM} nor on PATH: install it (`sudo apt-get install"
            " chromium`; scripts/test and .ci/run do it when run as root)"
        )
    return found


@pytest.fixture
async def browser(chromium_path: str) -> AsyncIterator[Browser]:
    expect.set_options(timeout=LIVE_MS)
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=chromium_path)
        try:
            yield chromium
        finally:
            await chromium.close()


@asynccontextmanager
async def signed_in(browser: Browser, stack: Stack, token: str) -> AsyncIterator[Tab]:
    """A new browser context signed in with `token` through the sign-in form."""
    context = await browser.new_context(
        base_url=stack.base_url, viewport={"width": 1400, "height": 900}
    )
    context.set_default_timeout(LIVE_MS)
    page = await context.new_page()
    opened = Tab(page)
    page.on("dialog", opened.on_dialog)
    page.on("pageerror", lambda exc: opened.errors.append(str(exc)))
    try:
        await page.goto("/login")
        await page.fill("#token", token)
        await page.click("#sign-in")
        await page.wait_for_url(stack.base_url + "/")
        yield opened
        assert opened.errors == []
    finally:
        await context.close()


@pytest.fixture
async def tab(browser: Browser, stack: Stack) -> AsyncIterator[Tab]:
    """A page signed in as the stack's operator."""
    async with signed_in(browser, stack, stack.token) as opened:
        yield opened


async def _submit(client: httpx.AsyncClient, **body: object) -> str:
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def test_when_a_job_is_submitted__it_appears_and_completes_live_without_a_reload(
    tab: Tab, client: httpx.AsyncClient, events: Events
) -> None:
    # given: the jobs page, open and live
    await tab.open("/")
    await tab.page.evaluate("window.vigilTestMarker = 42")

    # when: a job is submitted through the API
    job_id = await _submit(
        client,
        name="live demo",
        command='echo "hello $VIGIL_INPUT"; echo "PROGRESS: 100"',
        inputs=["a", "b"],
    )

    # then: it appears, and ends completed, on the same page
    row = tab.page.locator(f'#jobs tr[data-job-id="{job_id}"]')
    await expect(row).to_be_visible()
    await expect(row).to_have_attribute("data-state", "completed")
    await expect(row.locator('.count[data-state="completed"] b')).to_have_text("2")
    await expect(tab.page.locator(f'#feed li[data-key="job.succeeded.{job_id}"]')).to_have_count(1)
    assert await tab.page.evaluate("window.vigilTestMarker") == 42  # never reloaded
    await events.wait_key(f"job.succeeded.{job_id}")
    await expect(row.locator("td.progress")).to_have_text("2/2")  # its tasks at rest, of all
    await expect(row.locator("td.elapsed")).to_have_text(re.compile(r"^\d+:\d\d$"))
    await expect(row.locator("td.elapsed[data-ticking]")).to_have_count(0)  # it has ended
    await tab.screenshot("jobs-page")

    # and a job that has not ended counts its time on, live
    waiting = await _submit(client, name="held", command="true", configuring=True)
    await tab.open("/")  # (a configuring job announces nothing: it is not added live)
    elapsed = tab.page.locator(f'#jobs tr[data-job-id="{waiting}"] td.elapsed[data-ticking]')
    await expect(elapsed).to_have_text(re.compile(r"^0:0\d$"))
    first = await elapsed.text_content()
    await expect(elapsed).not_to_have_text(first or "")  # ticks every second

    # and its page shows the tasks, their progress and their logs
    await row.locator("a").click()
    await expect(tab.page.locator("#job-state")).to_have_text("completed")
    tasks = tab.page.locator("#tasks tr[data-task-id]")
    await expect(tasks).to_have_count(2)
    await expect(tasks.nth(0)).to_have_attribute("data-state", "completed")
    await expect(tasks.nth(0).locator("td.progress")).to_contain_text("100%")
    await expect(tab.page.locator("#logs")).to_contain_text("hello a")
    await expect(tab.page.locator("#logs")).to_contain_text("hello b")
    await tab.screenshot("job-page-completed")


async def test_when_buttons_are_pressed__the_page_shows_their_effect_live(
    tab: Tab, client: httpx.AsyncClient
) -> None:
    # given: a job whose two tasks sleep for long, shown on its page
    job_id = await _submit(client, name="sleeper", command="sleep 300", inputs=["x", "y"])
    await tab.open(f"/ui/jobs/{job_id}")
    tasks = tab.page.locator("#tasks tr[data-task-id]")
    for i in (0, 1):
        await expect(tasks.nth(i)).to_have_attribute("data-state", "on_cpu")

    # when: suspend, then resume, the job
    await tab.page.click('button[data-job-action="suspend"]')
    # then
    await expect(tab.page.locator("#job-summary")).to_have_attribute("data-state", "suspended")
    await expect(tab.page.locator("#flash")).to_contain_text("suspend accepted")
    await tab.page.click('button[data-job-action="resume"]')
    await expect(tab.page.locator("#job-summary")).to_have_attribute("data-state", "active")

    # when: the first task is cancelled with its row's control
    first = tasks.nth(0)
    await first.locator("select.task-action").select_option("cancel")
    await first.locator("button[data-task-apply]").click()
    # then: the row shows it terminated; the other still runs
    await expect(first).to_have_attribute("data-state", "terminated")
    await expect(tasks.nth(1)).to_have_attribute("data-state", "on_cpu")

    # when: the whole job is cancelled (the confirmation is accepted)
    await tab.page.click('button[data-job-action="cancel"]')
    # then
    await expect(tab.page.locator("#job-summary")).to_have_attribute("data-state", "cancelled")
    await expect(tasks.nth(1)).to_have_attribute("data-state", "terminated")
    assert any(d.startswith("confirm: Cancel job") for d in tab.dialogs)
    job = (await client.get(f"/jobs/{job_id}")).json()
    assert job["state"] == "cancelled"
    assert job["counts"] == {"terminated": 2}
    await tab.screenshot("job-page-cancelled")


async def test_when_a_job_name_input_and_output_are_hostile__they_show_as_text(
    tab: Tab, client: httpx.AsyncClient, events: Events
) -> None:
    # given: the jobs page open before the job exists, so its row arrives live
    await tab.open("/")
    job_id = await _submit(
        client,
        name=HOSTILE_NAME,
        command=f"echo '{HOSTILE_LINE}'",
        inputs=[HOSTILE_INPUT],
    )

    # then: on the jobs page
    row = tab.page.locator(f'#jobs tr[data-job-id="{job_id}"]')
    await expect(row).to_have_attribute("data-state", "completed")
    assert await row.locator("td.name").inner_text() == HOSTILE_NAME
    assert await tab.page.locator("#jobs img, #feed img").count() == 0

    # and on its page, whose log line arrives live
    await tab.open(f"/ui/jobs/{job_id}")
    await expect(tab.page.locator("#job-summary .name")).to_have_text(HOSTILE_NAME)
    await expect(tab.page.locator("#tasks td.input")).to_have_text(HOSTILE_INPUT)
    await expect(tab.page.locator("#logs .line")).to_have_text([HOSTILE_LINE])
    assert await tab.page.locator("main img, main script").count() == 0
    assert tab.dialogs == []  # no alert() ever ran
    await tab.screenshot("job-page-hostile")


async def test_the_hosts_page_shows_the_stack_host_with_its_worker_and_supervisor(
    tab: Tab, client: httpx.AsyncClient
) -> None:
    await tab.open("/ui/hosts")
    row = tab.page.locator(f'#hosts tr[data-host-id="{HOST_ID}"]')
    await expect(row).to_contain_text("registered")
    await expect(row.locator("td.age").nth(0)).to_contain_text("s ago")
    await expect(row.locator("td.age").nth(1)).to_contain_text("s ago")
    await expect(row.locator("td.quarantine")).to_have_text("no")

    # when a long job runs, the page (refreshing itself) counts it
    job_id = await _submit(client, command="sleep 300")
    await expect(row.locator("td.running")).to_have_text("1")
    await tab.screenshot("hosts-page")
    await client.post(f"/jobs/{job_id}/actions", json={"action": "cancel"})
    await expect(row.locator("td.running")).to_have_text("0")


async def test_when_an_operator_presses_emergency_stop__work_stops_until_resumed(
    tab: Tab, client: httpx.AsyncClient
) -> None:
    # given: a running job on the jobs page
    job_id = await _submit(client, name="long", command="sleep 300")
    await tab.open(f"/ui/jobs/{job_id}")
    task = tab.page.locator("#tasks tr[data-task-id]").first
    await expect(task).to_have_attribute("data-state", "on_cpu")

    # when: the operator presses the emergency stop and gives a reason
    tab.prompt_answer = "e2e drill"
    await tab.page.click("#emergency-stop")

    # then: the banner says so, the job is suspended and its command killed
    await expect(tab.page.locator("#emergency-banner")).to_contain_text("e2e drill")
    await expect(tab.page.locator("#job-summary")).to_have_attribute("data-state", "suspended")
    await expect(task).to_have_attribute("data-state", "failed_on_cluster")
    await expect(task.locator("td.error")).to_contain_text("emergency stop")
    await tab.screenshot("emergency-stop")

    # when: resumed from the banner
    await tab.page.click("#emergency-resume")
    # then
    await expect(tab.page.locator("#emergency-banner")).to_have_count(0)
    await expect(tab.page.locator("#job-summary")).to_have_attribute("data-state", "active")
    await expect(task).to_have_attribute("data-state", "on_cpu")
    await client.post(f"/jobs/{job_id}/actions", json={"action": "cancel"})


async def test_when_a_user_submits_a_job__it_appears_on_their_dashboard_and_no_one_elses_does(
    browser: Browser, stack: Stack, client: httpx.AsyncClient
) -> None:
    # given: a plain user, signed in, with no job yet
    token = uuid.uuid4().hex
    conn = await asyncpg.connect(stack.database_url)
    try:
        await users_repo.ensure_user(conn, f"alice-{token[:6]}", "user", token)
    finally:
        await conn.close()
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        signed_in(browser, stack, token) as tab,
        httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=10) as alice,
    ):
        await tab.open("/")
        assert not await tab.page.locator("#emergency-stop").count()

        # when: the operator submits a job, then the user
        theirs = await _submit(client, name="operator's", command="true")
        mine = await _submit(alice, name="alice's", command="echo mine", inputs=["1", "2"])

        # then: the user's appears (users cannot follow every job, so the page looks for new
        # ones) and ends completed, followed by id; the operator's never shows
        row = tab.page.locator(f'#jobs tr[data-job-id="{mine}"]')
        await expect(row).to_have_attribute("data-state", "completed")
        await expect(row.locator('.count[data-state="completed"] b')).to_have_text("2")
        assert await tab.page.locator(f'tr[data-job-id="{theirs}"]').count() == 0
        assert await tab.page.locator("#jobs th", has_text="Owner").count() == 0
        await tab.screenshot("jobs-page-user")


async def test_while_a_host_is_quarantined__every_page_shows_a_banner_saying_so(
    tab: Tab, client: httpx.AsyncClient
) -> None:
    await tab.open("/")
    banner = tab.page.locator("#quarantine-banner")
    await expect(banner).to_have_count(0)

    # when an operator quarantines the only host, the open page learns it by itself
    response = await client.post(
        f"/hosts/{HOST_ID}/actions",
        json={"action": "quarantine", "reason": "e2e disk check", "duration_s": 600},
    )
    assert response.status_code == 202, response.text
    try:
        await expect(banner).to_contain_text("Every host is quarantined", timeout=10_000)
        await expect(banner).to_contain_text(f"{HOST_ID}: quarantined until")
        await expect(banner).to_contain_text("e2e disk check")
        await tab.screenshot("quarantine-banner")
    finally:
        released = await client.post(f"/hosts/{HOST_ID}/actions", json={"action": "release"})
        assert released.status_code == 202, released.text
    await expect(banner).to_have_count(0, timeout=10_000)


async def test_an_operator_drains_quarantines_and_releases_a_host_from_the_hosts_page(
    tab: Tab, client: httpx.AsyncClient
) -> None:
    await tab.open("/ui/hosts")
    row = tab.page.locator(f'#hosts tr[data-host-id="{HOST_ID}"]')
    await expect(row).to_have_attribute("data-draining", "no")

    # drain (confirmed), then undrain
    await row.locator('button[data-host-action="drain"]').click()
    await expect(row).to_have_attribute("data-draining", "yes")
    await expect(row.locator("td.quarantine")).to_contain_text("draining")
    assert (await client.get("/hosts")).json()[0]["draining"]
    await row.locator('button[data-host-action="undrain"]').click()
    await expect(row).to_have_attribute("data-draining", "no")

    # quarantine (the prompt asks why), which the banner shows, then release
    tab.prompt_answer = "e2e bad disk"
    await row.locator('button[data-host-action="quarantine"]').click()
    await expect(row).to_have_attribute("data-quarantined", "yes")
    await expect(row.locator("td.quarantine")).to_contain_text("e2e bad disk")
    await expect(tab.page.locator("#quarantine-banner")).to_contain_text(HOST_ID)
    await tab.screenshot("hosts-page-quarantined")
    await row.locator('button[data-host-action="release"]').click()
    await expect(row).to_have_attribute("data-quarantined", "no")
    await expect(tab.page.locator("#quarantine-banner")).to_have_count(0)
    assert tab.errors == []


async def test_the_task_page_follows_its_log_live_filters_it_and_shows_the_attempts(
    tab: Tab, client: httpx.AsyncClient, events: Events, shared_dir: Path
) -> None:
    # given: a task that prints a line, then waits for the test before printing more
    go = shared_dir / f"go-{uuid.uuid4().hex[:6]}"
    command = f'echo first; while [ ! -e "{go}" ]; do sleep 0.05; done; echo "needle here";'
    command += f" echo second; echo {HOSTILE_LINE!r}"
    job_id = await _submit(client, command=command, inputs=["a"])
    task_id = (await events.wait_key(f"task.on_cpu.{job_id}"))["task_id"]

    # when: its page is open while it runs
    await tab.open(f"/ui/tasks/{task_id}")
    logs = tab.page.locator("#logs")
    await expect(logs).to_contain_text("first")
    await tab.page.evaluate("window.vigilTestMarker = 7")
    go.touch()

    # then: the next lines arrive live, and the head follows the task to its end
    await expect(logs).to_contain_text("needle here")
    await expect(logs).to_contain_text(HOSTILE_LINE)  # as text: an alert would fail the tab
    await expect(tab.page.locator("#task-state")).to_have_text("completed")
    attempts = tab.page.locator("#attempts tr[data-attempt]")
    await expect(attempts.last).to_have_attribute("data-outcome", "completed")
    assert await attempts.locator("svg.bar rect").count() == await attempts.count()
    assert await tab.page.evaluate("window.vigilTestMarker") == 7  # never reloaded

    # and the search box keeps only the matching lines, until it is cleared
    await tab.page.fill("#log-search", "NEEDLE")
    await expect(logs.locator(".log:not(.hidden)")).to_have_count(1)
    await expect(logs.locator(".log:not(.hidden)")).to_contain_text("needle here")
    await expect(tab.page.locator("#log-matches")).to_have_text("1 of 4 lines")
    await tab.screenshot("task-page")
    await tab.page.fill("#log-search", "")
    await expect(logs.locator(".log.hidden")).to_have_count(0)

    # and the job page links to it
    await tab.page.click(f'a[href="/ui/jobs/{job_id}"] >> nth=0')
    await tab.page.click(f'#tasks a[href="/ui/tasks/{task_id}"]')
    await expect(tab.page.locator("#task-head")).to_have_attribute("data-task-id", task_id)


async def test_the_task_page_lists_its_outputs_with_sizes_checksums_and_links_that_download(
    tab: Tab, client: httpx.AsyncClient, events: Events
) -> None:
    # given: a completed task with two outputs, one of 1.5 MiB
    big = b"vigil\n" * 262_144  # what `yes vigil | head -c 1572864` writes
    command = "yes vigil | head -c 1572864 > big.out; echo small > small.txt"
    job_id = await _submit(client, command=command, inputs=["a"], outputs=["big.out", "small.txt"])
    task_id = (await events.wait_key(f"task.completed.{job_id}"))["task_id"]
    sha256 = hashlib.sha256(big).hexdigest()

    # when: its page is open
    await tab.open(f"/ui/tasks/{task_id}")

    # then: each output shows its name, its size in human units, its checksum abbreviated
    # (the whole of it in the title), and a link
    outputs = tab.page.locator("#task-outputs li")
    await expect(outputs.locator("a")).to_have_text(["big.out", "small.txt"])
    await expect(outputs.locator(".size")).to_have_text(["1.5 MiB", "6 B"])
    shown = outputs.filter(has_text="big.out").locator(".sha256")
    await expect(shown).to_have_text(f"{sha256[:12]}…")
    await expect(shown).to_have_attribute("title", f"sha256 {sha256}")
    await tab.screenshot("task-page-outputs")

    # and the link downloads the output's bytes
    async with tab.page.expect_download() as started:
        await outputs.locator("a", has_text="big.out").click()
    download = await started.value
    assert download.suggested_filename == "big.out"
    assert await asyncio.to_thread(Path(await download.path()).read_bytes) == big


#: 250 confined commands take a minute and a half on two loaded cores: bounds to fit.
@pytest.mark.timeout(300)
async def test_a_busy_job_page_refreshes_rows_in_batches_and_keeps_its_log_and_feed_bounded(
    tab: Tab, client: httpx.AsyncClient, events: Events
) -> None:
    # given: the page of a job of 250 tasks, one of which prints 3,000 lines at once
    command = 'if [ "$VIGIL_INPUT" = 0 ]; then seq 1 3000; fi'
    job_id = await _submit(client, command=command, inputs=[str(i) for i in range(250)])
    asked: list[str] = []
    tab.page.on("request", lambda request: asked.append(request.url))
    await tab.open(f"/ui/jobs/{job_id}")

    # when: they all run while it is open
    await events.wait_key(f"job.succeeded.{job_id}", within=240)

    # then: every row shown ends completed, refreshed a batch of rows at a time
    rows = tab.page.locator("#tasks tr[data-task-id]")
    await expect(rows).to_have_count(200)  # the first page
    await expect(
        tab.page.locator('#tasks tr[data-task-id]:not([data-state="completed"])')
    ).to_have_count(0)
    await expect(tab.page.locator("#job-state")).to_have_text("completed")
    assert not [url for url in asked if "/ui/tasks/" in url]  # never a request per task
    batches = [url for url in asked if f"/ui/jobs/{job_id}/rows?" in url]
    assert all(url.count("task=") <= 200 for url in batches)

    # and the log and the feed keep their newest lines only
    logs = tab.page.locator("#logs .log")
    await expect(logs.last).to_contain_text("3000")
    assert await logs.count() <= 1000
    assert await tab.page.locator("#feed li").count() <= 100


async def test_the_jobs_page_charts_grow_live_as_tasks_run(
    tab: Tab, client: httpx.AsyncClient, events: Events
) -> None:
    # given: the operator's jobs page, open
    await tab.open("/")
    flow = tab.page.locator("#chart-flow")
    before = int(await flow.get_attribute("data-total") or 0)
    await tab.page.evaluate("window.vigilTestMarker = 9")

    # when: a job of three tasks runs
    job_id = await _submit(client, command="true", inputs=["a", "b", "c"])
    await events.wait_key(f"job.succeeded.{job_id}")

    # then: the chart of commands started and tasks ended grows by six, without a reload
    await expect(tab.page.locator("#chart-flow")).to_have_attribute("data-total", str(before + 6))
    assert await tab.page.locator("#chart-flow svg rect").count() > 0
    assert await tab.page.evaluate("window.vigilTestMarker") == 9
    await tab.screenshot("jobs-page-charts")


async def test_a_job_submitted_from_the_form_shows_its_errors_by_their_fields_then_runs(
    tab: Tab,
) -> None:
    # given: the new-job form, filled with a blank command and a memory limit too small
    await tab.page.goto("/ui/new")  # no live stream on a form
    await tab.page.fill('textarea[name="inputs"]', "a\nb")
    await tab.page.fill('input[name="policy.limits.memory_mb"]', "1")

    # when: it is submitted
    await tab.page.click("#submit-job")

    # then: each problem shows by its field, and nothing was made
    command = tab.page.locator('label:has(textarea[name="command"]) .field-error')
    await expect(command).to_contain_text("command is required")
    memory = tab.page.locator('label:has(input[name="policy.limits.memory_mb"]) .field-error')
    await expect(memory).to_contain_text("greater than or equal to 4")
    assert tab.page.url.endswith("/ui/new")
    await tab.screenshot("new-job-form-errors")

    # and once mended, the job is made and its page shows it run
    await tab.page.fill('textarea[name="command"]', 'echo "form $VIGIL_INPUT"')
    await tab.page.fill('input[name="policy.limits.memory_mb"]', "64")
    await tab.page.click("#submit-job")
    await tab.page.wait_for_url("**/ui/jobs/j-*")
    await expect(tab.page.locator("#job-state")).to_have_text("completed")
    await expect(tab.page.locator("#tasks tr[data-task-id]")).to_have_count(2)
    await expect(tab.page.locator("#logs")).to_contain_text("form b")


async def test_a_configuring_job_is_tried_edited_activated_and_purged_from_its_page(
    tab: Tab, client: httpx.AsyncClient, events: Events
) -> None:
    # given: a configuring job
    job_id = await _submit(client, command="echo one", inputs=["x", "y"], configuring=True)
    await tab.open(f"/ui/jobs/{job_id}")

    # when: a test task runs, then the command is edited
    await tab.page.click("#run-test")
    test_row = tab.page.locator('#tasks tr[data-index="-1"]')
    await expect(test_row).to_have_attribute("data-state", "completed")
    await tab.page.fill('#edit-form textarea[name="command"]', "echo two")
    await tab.page.click("#save-edit")
    await expect(tab.page.locator('#edit-form textarea[name="command"]')).to_have_attribute(
        "placeholder", "echo two"
    )  # the page came back with the job as edited

    # then: activated, its tasks run the edited command
    await tab.page.click('button[data-job-action="activate"]')
    await expect(tab.page.locator("#job-state")).to_have_text("completed")
    await expect(tab.page.locator("#logs")).to_contain_text("two")
    await tab.screenshot("job-page-activated")
    assert "configuring" not in (await client.get(f"/jobs/{job_id}")).json()["state"]

    # and an ended job is purged from its page, once confirmed
    await tab.page.reload()
    await tab.page.click('button[data-job-action="purge"]')
    await expect(tab.page.locator("#flash")).to_contain_text("purge accepted")
    assert any("Purge job" in d for d in tab.dialogs)
    assert (await client.get(f"/jobs/{job_id}")).json()["purged_at"] is not None


async def test_a_global_fix_is_previewed_then_applied_only_as_previewed(
    tab: Tab, client: httpx.AsyncClient, events: Events
) -> None:
    # given: a job whose two tasks failed
    job_id = await _submit(client, command="exit 3", inputs=["a", "b"])
    await events.wait_key(f"job.failed.{job_id}")
    await tab.page.goto("/ui/fixes")  # no live stream on a form
    await tab.page.select_option('select[name="selector.states"]', ["failed_on_cluster"])
    await tab.page.fill('input[name="selector.job_ids"]', job_id)
    await tab.page.select_option('select[name="action"]', "duplicate")

    # when: previewed
    await tab.page.click("#fix-preview")

    # then: it says what would change, and changed nothing
    result = tab.page.locator("#fix-result")
    await expect(result).to_contain_text("2 tasks of 1 jobs matched; duplicate would change 2")
    await expect(result.locator("table.sample tr")).to_have_count(3)
    apply = tab.page.locator("#fix-apply")
    await expect(apply).to_have_text("Apply to 2 tasks")
    assert len((await client.get(f"/jobs/{job_id}/tasks")).json()) == 2
    await tab.screenshot("fixes-preview")

    # and a changed form must be previewed again before anything is applied
    await tab.page.fill('input[name="selector.job_name"]', "nothing-like-it")
    await expect(apply).to_be_hidden()
    await tab.page.fill('input[name="selector.job_name"]', "")
    await tab.page.click("#fix-preview")
    await apply.click()
    await expect(result).to_contain_text("duplicate did change 2")
    await expect(tab.page.locator("#flash")).to_contain_text("fix applied: 2 tasks changed")
    tasks = (await client.get(f"/jobs/{job_id}/tasks")).json()
    assert len(tasks) == 4  # the two duplicates


async def test_an_operator_makes_a_user_gives_and_revokes_tokens_from_the_users_page(
    tab: Tab, stack: Stack
) -> None:
    # given: the users page
    await tab.page.goto("/ui/users")
    name = f"pat-{uuid.uuid4().hex[:6]}"

    # when: a user is made there
    await tab.page.fill('#new-user input[name="name"]', name)
    await tab.page.fill('#new-user input[name="label"]', "laptop")
    await tab.page.click("#create-user")

    # then: their token is shown once, and it works
    token = tab.page.locator("#issued-token")
    await expect(token).not_to_be_empty()
    issued = await token.text_content()
    assert issued
    async with httpx.AsyncClient(base_url=stack.base_url) as other:
        headers = {"Authorization": f"Bearer {issued}"}
        assert (await other.get("/jobs", headers=headers)).status_code == 200

        # and once revoked from the page, it works no more
        await tab.page.reload()
        row = tab.page.locator(f'#users tr[data-user="{name}"]')
        await row.locator('button[data-admin-action="revoke"]').click()
        await expect(row.locator("li .off")).to_have_text("revoked")
        assert (await other.get("/jobs", headers=headers)).status_code == 401

    # and disabling them is one more click, confirmed
    await row.locator('button[data-admin-action="disable"]').click()
    await expect(tab.page.locator(f'#users tr[data-user="{name}"]')).to_have_attribute(
        "data-disabled", "yes"
    )
    assert any("Disable" in d for d in tab.dialogs)


async def test_inputs_added_from_a_finished_jobs_page_run_as_new_tasks(
    tab: Tab, client: httpx.AsyncClient, events: Events
) -> None:
    job_id = await _submit(client, command='echo "got $VIGIL_INPUT"', inputs=["a"])
    await events.wait_key(f"job.succeeded.{job_id}")
    await tab.open(f"/ui/jobs/{job_id}")

    await tab.page.click("#append-inputs summary")
    await tab.page.fill('#inputs-form textarea[name="inputs"]', "p\nq")
    await tab.page.click("#add-inputs")

    await expect(tab.page.locator("#flash")).to_contain_text("inputs added")
    await expect(tab.page.locator("#tasks tr[data-task-id]")).to_have_count(3)
    await expect(tab.page.locator("#job-state")).to_have_text("completed")
    await expect(tab.page.locator("#logs")).to_contain_text("got q")


async def test_an_active_job_is_edited_from_its_page_and_a_refused_field_says_why(
    tab: Tab, client: httpx.AsyncClient, events: Events
) -> None:
    # given: an active job (its one task waits)
    job_id = await _submit(client, command="sleep 60", inputs=["a"])
    await events.wait_key(f"task.on_cpu.{job_id}")
    await tab.open(f"/ui/jobs/{job_id}")
    await tab.page.click("#edit-job summary")

    # when: its command is changed (refused once active)
    await tab.page.fill('#edit-form textarea[name="command"]', "echo no")
    await tab.page.click("#save-edit")

    # then: the form says why, and nothing changed
    await expect(tab.page.locator("#edit-form .form-errors")).to_contain_text("command")
    assert (await client.get(f"/jobs/{job_id}")).json()["command"] == "sleep 60"

    # and its throttle and retention change from the same form
    await tab.page.fill('#edit-form textarea[name="command"]', "")
    await tab.page.fill('#edit-form input[name="max_in_flight"]', "3")
    await tab.page.fill('#edit-form input[name="retention_s"]', "86400")
    await tab.page.click("#save-edit")
    await expect(tab.page.locator("#job-summary")).to_contain_text("max in flight 3")
    job = (await client.get(f"/jobs/{job_id}")).json()
    assert (job["max_in_flight"], job["retention_s"]) == (3, 86400)
    await client.post(f"/jobs/{job_id}/actions", json={"action": "cancel"})
