-- Neovim (0.7+) as porter's LSP client, headless: `nvim --headless --clean -u init.lua`.
-- Reads PORTER_NVIM_JOBS (JSON: a list of {file, code, nth, out}) and PORTER_NVIM_CMD (JSON:
-- the server command). For each job: open the file, attach `porter lsp`, wait for its
-- diagnostics, ask for the quick-fix of the nth diagnostic with `code`, apply it with
-- vim.lsp.util.apply_workspace_edit(edit, 'utf-16'), write the buffer to job.out and the
-- diagnostics Neovim holds to job.out .. '.json'. Any failure: message on stderr, exit 1.
local function fail(msg)
  io.stderr:write('init.lua: ' .. msg .. '\n')
  vim.cmd('cquit 1')
end

local ok, err = pcall(function()
  local jobs = vim.fn.json_decode(os.getenv('PORTER_NVIM_JOBS'))
  local cmd = vim.fn.json_decode(os.getenv('PORTER_NVIM_CMD'))
  local client_id = vim.lsp.start_client({
    name = 'porter',
    cmd = cmd,
    root_dir = vim.fn.fnamemodify(jobs[1].file, ':h'),
  })
  if not client_id then error('could not start ' .. table.concat(cmd, ' ')) end

  for _, job in ipairs(jobs) do
    vim.cmd('edit ' .. vim.fn.fnameescape(job.file))
    local bufnr = vim.api.nvim_get_current_buf()
    vim.lsp.buf_attach_client(bufnr, client_id)
    local got = vim.wait(60000, function() return #vim.diagnostic.get(bufnr) > 0 end, 20)
    if not got then error('no diagnostics for ' .. job.file) end
    local diags = vim.diagnostic.get(bufnr)
    table.sort(diags, function(a, b) return a.lnum < b.lnum or (a.lnum == b.lnum and a.col < b.col) end)
    local seen, chosen = {}, nil
    for _, d in ipairs(diags) do
      table.insert(seen, { lnum = d.lnum, col = d.col, end_lnum = d.end_lnum, end_col = d.end_col,
                           code = d.user_data and d.user_data.lsp and d.user_data.lsp.code or d.code,
                           source = d.source, severity = d.severity, message = d.message })
      if seen[#seen].code == job.code then
        job.nth = job.nth - 1
        if job.nth == 0 then chosen = d end
      end
    end
    local f = io.open(job.out .. '.json', 'w'); f:write(vim.fn.json_encode(seen)); f:close()
    if not chosen then error('no ' .. job.code .. ' diagnostic') end

    local client = vim.lsp.get_client_by_id(client_id)
    -- vim.diagnostic columns are byte offsets: back to UTF-16 for the request
    local function u16(l, byte)
      local text = vim.api.nvim_buf_get_lines(bufnr, l, l + 1, false)[1] or ''
      local _, units = vim.str_utfindex(text, math.min(byte, #text))
      return units
    end
    local range = { start = { line = chosen.lnum, character = u16(chosen.lnum, chosen.col) },
                    ['end'] = { line = chosen.end_lnum, character = u16(chosen.end_lnum, chosen.end_col) } }
    local lsp_diag = { range = range, message = chosen.message, severity = chosen.severity, source = chosen.source,
                       code = chosen.user_data.lsp.code, data = chosen.user_data.lsp.data }
    local params = { textDocument = { uri = vim.uri_from_bufnr(bufnr) }, range = range,
                     context = { diagnostics = { lsp_diag }, only = { 'quickfix' } } }
    local resp = client.request_sync('textDocument/codeAction', params, 60000, bufnr)
    if not resp or resp.err then error('codeAction failed: ' .. vim.inspect(resp)) end
    local action = nil
    for _, a in ipairs(resp.result or {}) do
      if vim.startswith(a.title, 'Fix ' .. job.code) then action = a end
    end
    if not action then error('no quick-fix for ' .. job.code .. ' in ' .. vim.inspect(resp.result)) end
    if not action.edit then
      local resolved = client.request_sync('codeAction/resolve', action, 60000, bufnr)
      if not resolved or resolved.err then error('resolve failed: ' .. vim.inspect(resolved)) end
      action = resolved.result
    end
    vim.lsp.util.apply_workspace_edit(action.edit, 'utf-16')
    local lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
    local out = io.open(job.out, 'w'); out:write(table.concat(lines, '\n') .. '\n'); out:close()
  end
  vim.lsp.stop_client(client_id)
  vim.wait(5000, function() return vim.lsp.get_client_by_id(client_id) == nil end, 20)
end)
if not ok then fail(tostring(err)) else vim.cmd('qall!') end
