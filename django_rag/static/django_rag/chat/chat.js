/* django_rag chat box: streams answers from the django_rag API (docs/chat.md).
   Plain JavaScript, no build step, no dependencies. Every text from the server is inserted
   with textContent, never as HTML. */
(function () {
  "use strict";

  function fill(template, citation) {
    return template.replace(/\{(source_id|document_id|chunk_id|collection)\}/g, function (_, key) {
      var value = citation[key];
      return encodeURIComponent(value === null || value === undefined ? "" : String(value));
    });
  }

  function safeHref(href) {
    try {
      var url = new URL(href, window.location.href);
      return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
    } catch (e) {
      return null;
    }
  }

  /* Server-Sent Events from a fetch() body (EventSource cannot POST). */
  async function readEvents(response, onEvent) {
    var reader = response.body.getReader();
    var decoder = new TextDecoder();
    var buffer = "";
    for (;;) {
      var chunk = await reader.read();
      if (chunk.done) break;
      buffer += decoder.decode(chunk.value, { stream: true });
      var end;
      while ((end = buffer.indexOf("\n\n")) !== -1) {
        var frame = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        var name = "message";
        var data = [];
        frame.split("\n").forEach(function (line) {
          if (line.indexOf("event:") === 0) name = line.slice(6).trim();
          else if (line.indexOf("data:") === 0) data.push(line.slice(5).trim());
        });
        if (data.length) onEvent(name, JSON.parse(data.join("\n")));
      }
    }
  }

  /* An error whose message is for the visitor: the API's text, or one of the box's own. */
  function shown(message) {
    var error = new Error(message);
    error.shown = true;
    return error;
  }

  function ChatBox(root) {
    this.root = root;
    this.api = root.dataset.api.replace(/\/?$/, "/");
    this.collection = root.dataset.collection || null;
    this.citationUrl = root.dataset.citationUrl || "";
    this.csrf = root.dataset.csrf || "";
    /* The box's own texts, translated by the template (data-text-*). */
    this.texts = {
      incomplete: root.dataset.textIncomplete || "The answer is incomplete.",
      unavailable: root.dataset.textUnavailable ||
        "No answer is available right now. Please try again later.",
      failed: root.dataset.textFailed || "The request failed. Please try again.",
      cut: root.dataset.textCut || "The answer was cut off. Please ask again.",
      source: root.dataset.textSource || "Source",
    };
    this.storageKey = "django_rag_chat:" + root.dataset.owner + ":" + this.api + ":" +
      (this.collection || "");
    this.log = root.querySelector("[data-rag-log]");
    this.form = root.querySelector("[data-rag-form]");
    this.input = root.querySelector("[data-rag-input]");
    this.send = root.querySelector("[data-rag-send]");
    this.conversation = null;
    var box = this;
    this.form.addEventListener("submit", function (event) {
      event.preventDefault();
      box.ask(box.input.value);
    });
    this.input.addEventListener("keydown", function (event) {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        box.ask(box.input.value);
      }
    });
    root.querySelector("[data-rag-new]").addEventListener("click", function () {
      box.forget();
    });
    this.restore();
  }

  ChatBox.prototype.request = function (method, path, body) {
    var headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (this.csrf) headers["X-CSRFToken"] = this.csrf;
    return fetch(this.api + path, {
      method: method,
      headers: headers,
      credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  };

  ChatBox.prototype.forget = function () {
    this.conversation = null;
    try { window.sessionStorage.removeItem(this.storageKey); } catch (e) { /* private mode */ }
    this.log.textContent = "";
  };

  ChatBox.prototype.restore = async function () {
    var id = null;
    try { id = window.sessionStorage.getItem(this.storageKey); } catch (e) { id = null; }
    if (!id) return;
    var response = await this.request("GET", "conversations/" + encodeURIComponent(id));
    if (!response.ok) { this.forget(); return; }
    var data = await response.json();
    this.conversation = data.id;
    var box = this;
    data.messages.forEach(function (message) {
      var bubble = box.bubble(message.role, message.text);
      if (message.role === "assistant") box.citations(bubble, message.citations);
    });
  };

  ChatBox.prototype.bubble = function (role, text) {
    var item = document.createElement("li");
    item.className = "rag-chat__message rag-chat__message--" + role;
    var body = document.createElement("div");
    body.className = "rag-chat__text";
    body.textContent = text || "";
    item.appendChild(body);
    this.log.appendChild(item);
    this.log.scrollTop = this.log.scrollHeight;
    return item;
  };

  ChatBox.prototype.citations = function (bubble, citations) {
    if (!citations || !citations.length) return;
    var list = document.createElement("ol");
    list.className = "rag-chat__sources";
    var box = this;
    citations.forEach(function (citation) {
      var item = document.createElement("li");
      item.value = citation.number;
      var label = citation.title || citation.filename || citation.source_id || box.texts.source;
      var href = box.citationUrl ? safeHref(fill(box.citationUrl, citation)) : null;
      var node = document.createElement(href ? "a" : "span");
      if (href) node.href = href;
      node.className = "rag-chat__source";
      node.textContent = "[" + citation.number + "] " + label;
      item.appendChild(node);
      list.appendChild(item);
    });
    bubble.appendChild(list);
  };

  ChatBox.prototype.start = async function () {
    var body = {};
    if (this.collection) body.collection = this.collection;
    var response = await this.request("POST", "conversations", body);
    var data = await response.json();
    if (!response.ok) throw shown(data.error ? data.error.message : this.texts.failed);
    this.conversation = data.id;
    try { window.sessionStorage.setItem(this.storageKey, String(data.id)); } catch (e) { /* ok */ }
  };

  ChatBox.prototype.ask = async function (text) {
    text = (text || "").trim();
    if (!text || this.busy) return;
    this.busy = true;
    this.send.disabled = true;
    this.input.value = "";
    this.bubble("user", text);
    var answer = this.bubble("assistant", "");
    var body = answer.querySelector(".rag-chat__text");
    answer.classList.add("rag-chat__message--streaming");
    var box = this;
    try {
      if (!this.conversation) await this.start();
      var response = await this.request(
        "POST", "conversations/" + this.conversation + "/messages", { message: text, stream: true }
      );
      if (!response.ok) {
        var error = await response.json().catch(function () { return {}; });
        throw shown(error.error ? error.error.message : box.texts.failed);
      }
      var finished = false;
      await readEvents(response, function (name, data) {
        if (name === "token") {
          body.textContent += data.text;
          box.log.scrollTop = box.log.scrollHeight;
        } else if (name === "done") {
          finished = true;
          body.textContent = data.text;
          box.citations(answer, data.citations);
        } else if (name === "error") {
          throw shown(data.message);
        }
      });
      if (!finished) throw shown(body.textContent.trim() ? this.texts.cut : this.texts.unavailable);
    } catch (err) {
      /* Part of an answer is incomplete; no words at all is no answer: unavailable. */
      var partial = body.textContent.trim() !== "";
      answer.classList.add("rag-chat__message--error");
      answer.classList.add(partial ? "rag-chat__message--incomplete" : "rag-chat__message--unavailable");
      var note = document.createElement("p");
      note.className = "rag-chat__error";
      /* A network or script error: the box's own words, never the browser's. */
      var message = err && err.shown ? err.message : (partial ? this.texts.cut : this.texts.failed);
      note.textContent = partial ? message + " (" + this.texts.incomplete + ")" : message;
      answer.appendChild(note);
    } finally {
      answer.classList.remove("rag-chat__message--streaming");
      this.busy = false;
      this.send.disabled = false;
      this.input.focus();
    }
  };

  function init() {
    document.querySelectorAll("[data-rag-chat]").forEach(function (root) {
      if (!root.ragChat) root.ragChat = new ChatBox(root);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
